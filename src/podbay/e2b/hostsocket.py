"""A WebSocket to a ``get_host(port)`` address: relayed, message by message,
to the same port's WebSocket on the sandbox's data plane (``/v1/ports/{port}``,
with the minted credential), as :mod:`.hosts` relays HTTP.

So every bound is the gateway's (:mod:`podbay.gateway.portsocket`): the
per-sandbox WebSocket cap, the handshake deadline, the idle timeout, the
message size; a refusal there (its status and words) is this one's, in E2B's
error shape. Each close, and its code, is passed on to the other side.
"""

from __future__ import annotations

import asyncio
import contextlib
import json

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus

from podbay.asgi import Receive, Scope, Send
from podbay.gateway.portsocket import MAX_MESSAGE, MAX_QUEUE

from .error_responses import E2BError, error_body

#: The gateway answers the upgrade within its own deadline; this bounds a data
#: plane that does not answer at all.
OPEN_SECONDS = 120.0


async def deny(send: Send, exc: E2BError) -> None:
    """Refuse the WebSocket before accepting it: E2B's error shape and status."""
    body = error_body(exc.status, exc.code, exc.message)
    await send(
        {
            "type": "websocket.http.response.start",
            "status": exc.status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "websocket.http.response.body", "body": body})


def _refusal(exc: InvalidStatus) -> E2BError:
    """The data plane's refusal (the contract's ``{"code", "error"}``) in E2B's shape."""
    status = exc.response.status_code
    try:
        body = json.loads(exc.response.body or b"")
        return E2BError(status, str(body["code"]), str(body["error"])[:4096])
    except (ValueError, KeyError, TypeError, RecursionError):
        return E2BError(status, "SANDBOX_UNREACHABLE", "the data plane refused the WebSocket")


async def relay(
    url: str, headers: list[tuple[bytes, bytes]], scope: Scope, receive: Receive, send: Send
) -> None:
    """Open ``url`` (the data plane's, http or https) with ``headers`` and relay
    until either side closes."""
    query = scope.get("query_string") or b""
    ws_url = "ws" + url.removeprefix("http") + ("?" + query.decode("latin-1") if query else "")
    try:
        upstream = await connect(
            ws_url,
            additional_headers=[(k.decode("latin-1"), v.decode("latin-1")) for k, v in headers],
            subprotocols=scope.get("subprotocols") or None,
            max_size=MAX_MESSAGE,
            max_queue=MAX_QUEUE,
            open_timeout=OPEN_SECONDS,
            # The gateway's server pings this leg; the client's own leg is
            # pinged by this server: a ping here would only add traffic.
            ping_interval=None,
            compression=None,
            user_agent_header=None,
        )
    except InvalidStatus as exc:
        await deny(send, _refusal(exc))
        return
    except (OSError, InvalidHandshake, TimeoutError) as exc:
        await deny(send, E2BError(502, "SANDBOX_UNREACHABLE", f"the data plane failed: {exc}"))
        return
    try:
        if await receive() != {"type": "websocket.connect"}:
            return
        await send({"type": "websocket.accept", "subprotocol": upstream.subprotocol})
        await _pump(upstream, receive, send)
    finally:
        await upstream.close()


async def _pump(upstream: ClientConnection, receive: Receive, send: Send) -> None:
    inbound = asyncio.ensure_future(_client_to_upstream(upstream, receive))
    outbound = asyncio.ensure_future(_upstream_to_client(upstream, send))
    try:
        await asyncio.wait({inbound, outbound}, return_when=asyncio.FIRST_COMPLETED)
        if not outbound.done():
            # Upstream was told the client left, or is closing: its close, briefly.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(outbound), 5)
        client_left = (
            inbound.done()
            and not inbound.cancelled()
            and inbound.exception() is None
            and inbound.result()
        )
        if not client_left:
            # Upstream's close (its code and reason) ends the client's side too.
            rcvd = upstream.protocol.close_rcvd
            code = 1011 if rcvd is None else rcvd.code if rcvd.code != 1005 else 1000
            reason = "" if rcvd is None else rcvd.reason
            with contextlib.suppress(Exception):
                await send({"type": "websocket.close", "code": code, "reason": reason})
    finally:
        for task in (inbound, outbound):
            task.cancel()
        for task in (inbound, outbound):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


async def _client_to_upstream(upstream: ClientConnection, receive: Receive) -> bool:
    """Until the client leaves (True: upstream is told) or upstream closes (False)."""
    while True:
        message = await receive()
        if message["type"] == "websocket.disconnect":
            code = int(message.get("code") or 1000)
            code = code if code == 1000 or 3000 <= code <= 4999 else 1001
            await upstream.close(code, str(message.get("reason") or ""))
            return True
        try:
            if message.get("bytes") is not None:
                await upstream.send(message["bytes"])
            elif message.get("text") is not None:
                await upstream.send(str(message["text"]))
        except ConnectionClosed:
            return False


async def _upstream_to_client(upstream: ClientConnection, send: Send) -> None:
    with contextlib.suppress(ConnectionClosed):
        async for message in upstream:
            if isinstance(message, str):
                await send({"type": "websocket.send", "text": message})
            else:
                await send({"type": "websocket.send", "bytes": message})
