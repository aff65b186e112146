"""``get_host(port)``: ``{port}-{sandboxID}.{domain}`` reaches a server
listening on ``port`` in the sandbox, by the request's ``Host``.

The domain is the address the create was sent to (a loopback one as
``localhost:PORT``, so the SDK's host is ``8080-<id>.localhost:8700``, which
browsers, curl and systemd-resolved resolve to this machine). A request for
such a host must carry the sandbox's access token (``X-Access-Token``, or
``E2B-Traffic-Access-Token`` as E2B names it for traffic) or an API key of
its deployment; without one it is refused (401), as E2B's proxy refuses
traffic to a secured sandbox. The request is relayed over HTTP to the
sandbox's data plane (``/v1/ports/{port}/…`` on its gateway, with the minted
credential), a WebSocket likewise (:mod:`.hostsocket`), so the port proxy's
rules apply: what the server answers is
bounded and stripped there, and a share URL made through podbay's API
(``POST /api/v1/sandboxes/{name}/ports/{port}/share``) is the way in without
a header (a browser).
"""

from __future__ import annotations

import contextlib
import ipaddress
import re
from collections.abc import AsyncIterator
from urllib.parse import urlsplit

import httpx
from starlette.datastructures import Headers
from starlette.requests import Request

from podbay.asgi import Receive, Scope, Send
from podbay.control.services.sandboxes import Attached
from podbay.wire.paths import CREDENTIAL_HEADER, PORTS

from . import hostsocket
from .error_responses import E2BError, error_body
from .interpreter import TRAFFIC_TOKEN_HEADER
from .relay import ACCESS_TOKEN_HEADER
from .service import E2BService

#: ``8080-<20 lowercase letters and digits>.<domain>``.
_HOST = re.compile(rb"^(\d{1,5})-([a-z0-9]{20})\.")
#: Not relayed: hop-by-hop, the caller's credentials, and what the proxy sets
#: (for a WebSocket, its handshake's own headers too).
_DROP_REQUEST = frozenset(
    {
        b"host",
        b"sec-websocket-key",
        b"sec-websocket-version",
        b"sec-websocket-extensions",
        b"sec-websocket-protocol",
        b"connection",
        b"keep-alive",
        b"transfer-encoding",
        b"te",
        b"upgrade",
        b"proxy-authorization",
        b"x-api-key",
        ACCESS_TOKEN_HEADER.encode(),
        TRAFFIC_TOKEN_HEADER.encode(),
        CREDENTIAL_HEADER.lower().encode(),
    }
)
_DROP_RESPONSE = frozenset({b"connection", b"keep-alive", b"transfer-encoding"})


def target(headers: list[tuple[bytes, bytes]]) -> tuple[int, str] | None:
    """The (port, sandbox id) a request's ``Host`` names, or None."""
    for key, value in headers:
        if key == b"host":
            found = _HOST.match(value.lower())
            if found is None:
                return None
            port = int(found.group(1))
            return (port, found.group(2).decode()) if 1 <= port <= 65535 else None
    return None


def domain_for(request: Request) -> str:
    """The domain ``get_host`` builds on: the address this request reached
    (an IP literal or ``localhost`` becomes ``localhost:PORT``: a name under
    which ``{port}-{id}.`` can stand)."""
    host = request.headers.get("host") or "localhost"
    name, _, port = host.rpartition(":") if not host.endswith("]") else (host, "", "")
    if not name or not port.isdigit():
        name, port = host, ""
    name = name.strip("[]")
    loopback = name == "localhost"
    with contextlib.suppress(ValueError):
        ipaddress.ip_address(name)
        loopback = True
    if loopback:
        return f"localhost:{port}" if port else "localhost"
    return host


async def _error(send: Send, exc: E2BError) -> None:
    body = error_body(exc.status, exc.code, exc.message)
    await send(
        {
            "type": "http.response.start",
            "status": exc.status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


class HostProxy:
    """The ASGI app for requests whose ``Host`` is a ``get_host`` address."""

    def __init__(self, service: E2BService) -> None:
        self.service = service

    async def port_url(self, scope: Scope) -> tuple[int, str, Attached]:
        """The port the request names, the data plane's URL of that port and
        the path (its query not included), and the sandbox reached; :class:`E2BError` when the
        request may not reach it (the same checks for HTTP and WebSocket)."""
        found = target(scope["headers"])
        assert found is not None  # routed here by it
        port, sandbox_id = found
        headers = Headers(scope=scope)  # an HTTP request's or a WebSocket's
        token = headers.get(ACCESS_TOKEN_HEADER) or headers.get(TRAFFIC_TOKEN_HEADER)
        deployment, row = await self.service.authorize(sandbox_id, token, headers.get("x-api-key"))
        attached = await self.service.reach(deployment, sandbox_id, row)
        path = scope.get("raw_path") or scope["path"].encode()
        if not path.startswith(b"/") or any(part in (b".", b"..") for part in path.split(b"/")):
            # The relay's URL would resolve them, out of the port's path on the
            # data plane (to the sandbox's exec and files, with its credential).
            raise E2BError(400, "REQUEST_INVALID", "a path with . or .. segments is not relayed")
        return port, f"{attached.endpoint}{PORTS}/{port}{path.decode('latin-1')}", attached

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            port, url, attached = await self.port_url(scope)
        except E2BError as exc:
            if scope["type"] == "websocket":
                await hostsocket.deny(send, exc)
            else:
                await _error(send, exc)
            return
        headers = [(k, v) for k, v in scope["headers"] if k not in _DROP_REQUEST]
        headers.append((CREDENTIAL_HEADER.encode(), attached.credential.encode()))
        if scope["type"] == "websocket":
            await hostsocket.relay(url, headers, scope, receive, send)
            return
        query = scope.get("query_string") or b""
        outgoing = self.service.http.build_request(
            scope["method"],
            url + ("?" + query.decode("latin-1") if query else ""),
            headers=headers,
            content=_body(receive) if _has_body(scope) else None,
        )
        try:
            answer = await self.service.http.send(outgoing, stream=True)
        except httpx.HTTPError as exc:
            await _error(
                send, E2BError(502, "SANDBOX_UNREACHABLE", f"the data plane failed: {exc}")
            )
            return
        # The port proxy words a redirect within the port under its own path;
        # under this host that path is the root.
        prefix = (urlsplit(attached.endpoint).path + f"{PORTS}/{port}").encode()
        try:
            await send(
                {
                    "type": "http.response.start",
                    "status": answer.status_code,
                    "headers": [
                        (k.lower(), _unprefixed(k, v, prefix))
                        for k, v in answer.headers.raw
                        if k.lower() not in _DROP_RESPONSE
                    ],
                }
            )
            async for chunk in answer.aiter_raw():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        finally:
            await answer.aclose()


def _unprefixed(key: bytes, value: bytes, prefix: bytes) -> bytes:
    if key.lower() == b"location" and value.startswith(prefix):
        return value[len(prefix) :] or b"/"
    return value


def _has_body(scope: Scope) -> bool:
    return any(
        key == b"transfer-encoding" or (key == b"content-length" and value.strip() != b"0")
        for key, value in scope["headers"]
    )


async def _body(receive: Receive) -> AsyncIterator[bytes]:
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return
        chunk: bytes = message.get("body", b"")
        if chunk:
            yield chunk
        if not message.get("more_body", False):
            return
