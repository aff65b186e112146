"""The console's page and assets, from the package's ``static/`` directory
(the build of ``console/`` at the repository's root: ``./run`` builds it, and
the wheel carries it, so an installed server needs no node).

Every answer carries the headers that keep whatever a sandbox produced from
running as script in the console's origin: a Content-Security-Policy that
allows only this origin's own script and style files (no inline script or
style, no plugins, no framing), and ``nosniff``.
"""

from __future__ import annotations

import functools
import mimetypes
import re
from pathlib import Path

from podbay.asgi import Scope, Send
from podbay.errors import ApiError
from podbay.wire.codes import ErrorCode

STATIC = Path(__file__).parent / "static"
ASSETS_PREFIX = "/console/assets/"
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; font-src 'self'; object-src 'none'; base-uri 'none'; "
    "frame-ancestors 'none'; form-action 'self'"
)
#: Headers on every console answer (the page, its assets, its JSON).
SECURITY_HEADERS: list[tuple[bytes, bytes]] = [
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
]
PAGE_HEADERS: list[tuple[bytes, bytes]] = [
    *SECURITY_HEADERS,
    (b"content-security-policy", CSP.encode()),
    (b"x-frame-options", b"DENY"),
    (b"cache-control", b"no-store"),
]
_TYPES = {
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".html": "text/html; charset=utf-8",
    ".map": "application/json",
    ".txt": "text/plain; charset=utf-8",
    ".svg": "image/svg+xml",
    ".woff2": "font/woff2",
}


_ASSET_NAME = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}")


#: The console's client-side routes are below this: each answers the page,
#: which shows the view the path names.
APP_PREFIX = "/console/app/"


def is_page(path: str) -> bool:
    """The paths that answer the console's page."""
    return path in ("/", "/console", "/console/") or path.startswith(APP_PREFIX)


def _not_built() -> ApiError:
    return ApiError(
        ErrorCode.ROUTE_NOT_FOUND,
        "the console is not built into this installation (./run builds it from console/)",
    )


@functools.lru_cache(maxsize=256)
def _load(path: Path) -> bytes | None:
    """A built file's bytes (None: absent), read once per process: the build
    does not change under an installed server (``./run serve`` starts anew)."""
    try:
        return path.read_bytes() if path.is_file() else None
    except OSError:
        return None


async def _send_file(send: Send, path: Path, headers: list[tuple[bytes, bytes]]) -> None:
    body = _load(path)
    if body is None:
        raise ApiError(ErrorCode.ROUTE_NOT_FOUND, "no such console file")
    kind = _TYPES.get(path.suffix) or mimetypes.guess_type(path.name)[0]
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [
                (b"content-type", (kind or "application/octet-stream").encode()),
                (b"content-length", str(len(body)).encode()),
                *headers,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def page(send: Send) -> None:
    index = STATIC / "index.html"
    if _load(index) is None:
        raise _not_built()
    await _send_file(send, index, PAGE_HEADERS)


async def asset(scope: Scope, send: Send) -> None:
    """A file under ``static/assets/``; nothing outside it, whatever the path says."""
    name = scope["path"][len(ASSETS_PREFIX) :]
    # Asset names are plain file names: nothing else is looked up on disk.
    if not _ASSET_NAME.fullmatch(name):
        raise ApiError(ErrorCode.ROUTE_NOT_FOUND, "no such console asset")
    wanted = STATIC / "assets" / name
    # Asset names do not change with their content: revalidated, never stale.
    await _send_file(send, wanted, [*PAGE_HEADERS[:-1], (b"cache-control", b"no-cache")])
