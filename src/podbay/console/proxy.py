"""``/console/sandboxes/{deployment}/{name}/v1/...``: the data plane for the
console's page, authenticated by its session cookie.

The page never holds a sandbox credential: the server attaches the sandbox
(resuming it, never creating one), mints the credential itself and hands
the request to its gateway under the sandbox's data-plane path. Only the
paths the console uses pass (info, exec, processes, files, the terminal):
a port's relay would serve a sandbox's own pages in the console's origin,
where their script would act with the operator's session.

What comes back is the sandbox's, so it is marked never to be rendered in
this origin: ``nosniff``, a CSP that allows nothing and sandboxes the
document, and ``Content-Disposition: attachment`` on anything that is not
JSON (a file's bytes). The page fetches and shows it as text or a Blob.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlsplit

from podbay.asgi import ASGIApp, Message, Receive, Scope, Send
from podbay.dataplane.environment_seam import Building
from podbay.errors import ApiError
from podbay.wire.codes import ErrorCode
from podbay.wire.paths import CREDENTIAL_HEADER, EXEC, FILES, INFO, PROCESSES, PTY

from .guard import CSRF_HEADER, DEPLOYMENT_HEADER, Guard

if TYPE_CHECKING:
    from podbay.control.services.sandboxes import SandboxService

PREFIX = "/console/sandboxes/"
#: Data-plane paths the console may reach (and the paths below the last three).
_ALLOWED = (INFO, EXEC, PTY)
_ALLOWED_TREES = (FILES, PROCESSES)
_DROPPED = {
    b"cookie",
    b"authorization",
    CSRF_HEADER.encode(),
    DEPLOYMENT_HEADER.encode(),
    CREDENTIAL_HEADER.lower().encode(),
}
#: Headers of a relayed answer that reach the page (besides ``X-Podbay-*``).
_KEPT = {b"content-type", b"content-length", b"retry-after", b"x-request-id", b"etag"}
_ANSWER_HEADERS = [
    (b"x-content-type-options", b"nosniff"),
    (b"content-security-policy", b"default-src 'none'; sandbox"),
    (b"cache-control", b"no-store"),
]


#: (the sandbox's data-plane URL, the request carrying its credential, receive,
#: send): serves it, in process (:class:`LocalDataPlane`) or on the sandbox's
#: node (:class:`~.remote.RemoteDataPlane`).
DataPlane = Callable[[str, Scope, Receive, Send], Awaitable[None]]


class LocalDataPlane:
    """``podbay serve``'s: the request handed to this process's gateway."""

    def __init__(self, gateway: ASGIApp) -> None:
        self.gateway = gateway

    async def __call__(self, url: str, scope: Scope, receive: Receive, send: Send) -> None:
        path = urlsplit(url).path
        inner = {**scope, "path": unquote(path), "raw_path": path.encode("latin-1")}
        await self.gateway(inner, receive, send)


def answer_headers(headers: Iterable[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """A relayed answer's headers as the console's page gets them: only those
    that describe the content pass (a hostile sandbox may answer in its agent's
    place: no ``Set-Cookie`` into the console's origin, no ``Refresh``, no
    ``Link``, no CORS), then the marks that keep it from being rendered."""
    kept = [
        (key.lower(), value)
        for key, value in headers
        if key.lower() in _KEPT or key.lower().startswith(b"x-podbay-")
    ]
    kind = next((value for key, value in kept if key == b"content-type"), b"")
    marks = list(_ANSWER_HEADERS)
    if not kind.startswith(b"application/json"):
        marks.append((b"content-disposition", b"attachment"))
    return [*kept, *marks]


def _allowed(tail: str) -> bool:
    """Whether the console may reach ``tail``. Dot segments are refused, plain
    or percent-encoded: a URL library on the way (the cluster's relay) would
    resolve ``/v1/files/../ports/80/`` into a port's relay."""
    decoded = unquote(tail)
    segments = decoded.split("/")
    if "." in segments or ".." in segments or "\\" in decoded:
        return False
    return tail in _ALLOWED or any(
        tail == tree or tail.startswith(tree + "/") for tree in _ALLOWED_TREES
    )


def _split(raw_path: bytes) -> tuple[str, str, bytes]:
    """The deployment's name, the sandbox's name and the data-plane path."""
    deployment, _, rest = raw_path[len(PREFIX) :].partition(b"/")
    name, slash, tail = rest.partition(b"/")
    if not deployment or not name or not slash:
        raise ApiError(
            ErrorCode.ROUTE_NOT_FOUND,
            "console data-plane paths are /console/sandboxes/{deployment}/{name}/v1/...",
        )
    return deployment.decode("latin-1"), name.decode("latin-1"), b"/" + tail


def _not_found(name: str) -> ApiError:
    # The same answer whether the name or its deployment is out of reach.
    return ApiError(ErrorCode.SANDBOX_NOT_FOUND, f"no sandbox named {name!r}")


async def relay(
    guard: Guard,
    sandboxes: SandboxService,
    data_plane: DataPlane,
    scope: Scope,
    receive: Receive,
    send: Send,
) -> None:
    websocket = scope["type"] == "websocket"
    session = await guard.session(scope, websocket=websocket)
    raw_path: bytes = scope.get("raw_path") or scope["path"].encode()
    deployment_name, name, tail = _split(raw_path)
    if not _allowed(tail.decode("latin-1")):
        raise ApiError(
            ErrorCode.ROUTE_NOT_FOUND,
            "the console reaches a sandbox's info, exec, processes, files and terminal only",
        )
    try:
        deployment = await guard.deployment(session, deployment_name)
    except ApiError as exc:
        if exc.code in (ErrorCode.DEPLOYMENT_FORBIDDEN, ErrorCode.DEPLOYMENT_NOT_FOUND):
            raise _not_found(name) from None
        raise
    row = await sandboxes.get(deployment, name)
    attached = await sandboxes.attach(deployment, name, row.asked_class, row.options)
    if isinstance(attached, Building):  # its environment is being built again
        raise ApiError(
            ErrorCode.SANDBOXES_UNAVAILABLE, "the sandbox is being prepared; retry", retry_after=2
        )
    headers = [(k, v) for k, v in scope["headers"] if k not in _DROPPED]
    headers.append((CREDENTIAL_HEADER.lower().encode(), attached.credential.encode()))
    inner = {**scope, "headers": headers}
    url = attached.endpoint + tail.decode("latin-1")
    if websocket:
        await data_plane(url, inner, receive, send)
        return

    async def marked(message: Message) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": answer_headers(message.get("headers", []))}
        await send(message)

    await data_plane(url, inner, receive, marked)
