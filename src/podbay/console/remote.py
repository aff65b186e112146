"""The console's data plane on a control replica: the request relayed over
the network to the node whose gateway serves the sandbox (its handle's
``endpoint``), since a replica has no gateway of its own.

HTTP goes through with its body streamed both ways; a WebSocket (the
terminal) is opened to the node first, so the node's refusal reaches the
page as its own answer, and then messages are pumped both ways until either
side closes. The credential travels to the node only; the page never sees
it. ``podbay serve`` hands the request to its in-process gateway instead
(:mod:`.proxy`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator

import httpx
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from podbay.asgi import Receive, Scope, Send, send_refusal
from podbay.errors import ApiError
from podbay.wire.codes import ErrorCode

#: Headers that belong to one hop, never relayed (RFC 9110 7.6.1), and the
#: WebSocket handshake's own, which the client library makes anew.
_HOP = {
    b"connection",
    b"keep-alive",
    b"proxy-connection",
    b"te",
    b"trailer",
    b"transfer-encoding",
    b"upgrade",
    b"host",
}
_WS_HANDSHAKE = {
    b"sec-websocket-key",
    b"sec-websocket-version",
    b"sec-websocket-extensions",
    b"sec-websocket-protocol",
    b"origin",
}
_UNSENDABLE = {1005, 1006, 1015}
#: Longest wait for a node to accept a connection.
CONNECT_SECONDS = 10.0


def _unreachable(exc: BaseException) -> ApiError:
    return ApiError(ErrorCode.AGENT_UNREACHABLE, f"the sandbox's node did not answer: {exc}")


class RemoteDataPlane:
    """Relays the console's data-plane calls to a sandbox's node."""

    def __init__(self, client: httpx.AsyncClient | None = None) -> None:
        # No read timeout: an exec or a download lasts as long as it lasts.
        self.client = client or httpx.AsyncClient(
            timeout=httpx.Timeout(None, connect=CONNECT_SECONDS)
        )

    async def close(self) -> None:
        await self.client.aclose()

    async def __call__(self, url: str, scope: Scope, receive: Receive, send: Send) -> None:
        """Relay ``scope`` (already carrying the credential) to ``url``."""
        if scope["type"] == "websocket":
            await self._websocket(url, scope, receive, send)
        else:
            await self._http(url, scope, receive, send)

    async def _http(self, url: str, scope: Scope, receive: Receive, send: Send) -> None:
        query = scope.get("query_string") or b""
        request = self.client.build_request(
            scope["method"],
            url + ("?" + query.decode("latin-1") if query else ""),
            headers=[(k, v) for k, v in scope["headers"] if k not in _HOP],
            content=_body(receive),
        )
        try:
            answer = await self.client.send(request, stream=True)
        except httpx.HTTPError as exc:
            raise _unreachable(exc) from None
        try:
            await send(
                {
                    "type": "http.response.start",
                    "status": answer.status_code,
                    "headers": [
                        (k.lower(), v) for k, v in answer.headers.raw if k.lower() not in _HOP
                    ],
                }
            )
            async for chunk in answer.aiter_raw():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        finally:
            await answer.aclose()

    async def _websocket(self, url: str, scope: Scope, receive: Receive, send: Send) -> None:
        headers = [
            (k.decode("latin-1"), v.decode("latin-1"))
            for k, v in scope["headers"]
            if k not in _HOP and k not in _WS_HANDSHAKE
        ]
        try:
            upstream = await connect(
                "ws" + url.removeprefix("http"),
                additional_headers=headers,
                open_timeout=CONNECT_SECONDS,
                max_size=None,
            )
        except InvalidStatus as exc:
            await _deny(scope, send, exc)
            return
        except (OSError, TimeoutError) as exc:
            raise _unreachable(exc) from None
        async with upstream:
            if await receive() != {"type": "websocket.connect"}:
                return
            await send({"type": "websocket.accept"})
            await _pump(upstream, receive, send)


async def _body(receive: Receive) -> AsyncIterator[bytes]:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
        chunk = message.get("body", b"")
        if chunk:
            yield chunk
        if not message.get("more_body"):
            return


async def _deny(scope: Scope, send: Send, refused: InvalidStatus) -> None:
    """The node's refusal of the WebSocket, passed on as the page's answer."""
    try:
        body = json.loads(refused.response.body or b"")
        exc = ApiError(ErrorCode(body["code"]), str(body["error"]))
    except (ValueError, KeyError, TypeError):
        exc = ApiError(ErrorCode.AGENT_UNREACHABLE, "the sandbox's node refused the terminal")
    if "websocket.http.response" in (scope.get("extensions") or {}):
        await send_refusal(send, exc, kind="websocket.http")
    else:
        await send({"type": "websocket.close", "code": 1008})


async def _pump(upstream: ClientConnection, receive: Receive, send: Send) -> None:
    """Messages both ways until one side closes; the other is then closed alike."""

    async def from_page() -> None:
        while True:
            message = await receive()
            if message["type"] == "websocket.disconnect":
                await upstream.close()
                return
            data = message.get("bytes")
            await upstream.send(data if data is not None else message.get("text") or "")

    async def to_page() -> None:
        try:
            async for data in upstream:
                if isinstance(data, bytes):
                    await send({"type": "websocket.send", "bytes": data})
                else:
                    await send({"type": "websocket.send", "text": data})
        except ConnectionClosed:
            pass
        code = upstream.close_code or 1000
        # Codes that only report a close, never sent in one (RFC 6455 7.4.1).
        await send({"type": "websocket.close", "code": 1011 if code in _UNSENDABLE else code})

    page = asyncio.ensure_future(from_page())
    node = asyncio.ensure_future(to_page())
    try:
        await asyncio.wait({page, node}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (page, node):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, ConnectionClosed):
                await task
