"""A WebSocket to a server in the sandbox: ``/v1/ports/{port}/<path>`` (and a
share URL, and E2B's ``get_host`` address, which comes here through the data
plane) upgraded.

The client's WebSocket ends at the ASGI server (uvicorn), which hands over
messages, not bytes; so this relays *messages*: the gateway runs the client
side of the handshake to the sandbox's server with websockets' sans-I/O
protocol over a tunnel of its own (``podbay-tunnel``), then pumps messages
both ways. Parsing what the server sends (rather than splicing bytes after
its 101) is also what bounds it: a message over :data:`MAX_MESSAGE` closes
both sides with 1009, a broken frame with 1002, and the server's extensions
and ping timing never reach the client.

Bounds, each side: every write waits for the other side to drain
(backpressure, nothing buffered beyond one message); the server must answer
the upgrade within ``handshake_seconds`` (else 502 ``PORT_UNREACHABLE``,
saying so); no message either way for ``idle_seconds`` closes both sides with
1001 (pings do not count); the client gone (a close, or uvicorn's ping
unanswered) closes the server's side with a close frame and then its
connection; the server's close reaches the client with its code.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path

from websockets.client import ClientProtocol
from websockets.exceptions import InvalidHandshake, InvalidState, PayloadTooBig
from websockets.frames import Frame, Opcode
from websockets.http11 import Response as WsResponse
from websockets.uri import parse_uri

from podbay.asgi import Receive, Scope, Send
from podbay.errors import ApiError
from podbay.wire import paths
from podbay.wire.codes import ErrorCode

from .upgrade import READ_LIMIT, upgrade

log = logging.getLogger("podbay.gateway")

#: Largest WebSocket message relayed either way (uvicorn's ``ws_max_size``
#: bounds the client's).
MAX_MESSAGE = 1024 * 1024
#: Messages a WebSocket's receiving side holds before the reader takes them
#: (uvicorn's ``ws_max_queue``, E2B's ``get_host`` leg): with
#: :data:`MAX_MESSAGE`, what one connection may buffer.
MAX_QUEUE = 8
#: How long the server's answer to our close may take once the client left.
CLOSE_SECONDS = 5.0
#: Headers the handshake sets itself.
_HANDSHAKE = frozenset(
    {"sec-websocket-key", "sec-websocket-version", "upgrade", "connection", "host"}
)


async def relay(
    socket: Path,
    port: int,
    target: str,
    headers: list[tuple[bytes, bytes]],
    scope: Scope,
    receive: Receive,
    send: Send,
    *,
    handshake_seconds: float,
    idle_seconds: float,
) -> ApiError | None:
    """Connect to the WebSocket server on ``port`` (``target``: its path and
    query; ``headers``: what it is told of the client) and relay until either
    side closes. Returns the refusal to answer (before accepting) when the
    upstream handshake fails."""
    try:
        reader, writer = await upgrade(
            socket, "GET", f"{paths.TUNNEL}?port={port}", paths.UPGRADE_TUNNEL
        )
    except ApiError as exc:
        return exc
    try:
        protocol = ClientProtocol(
            parse_uri(f"ws://localhost:{port}{target}"),
            subprotocols=scope.get("subprotocols") or None,
            max_size=MAX_MESSAGE,
        )
        request = protocol.connect()
        for key, value in headers:
            name = key.decode("latin-1")
            if name not in _HANDSHAKE:
                request.headers[name] = value.decode("latin-1")
        protocol.send_request(request)
        writer.write(b"".join(protocol.data_to_send()))
        response = await asyncio.wait_for(_handshake(protocol, reader), handshake_seconds)
    except TimeoutError:
        writer.close()
        return ApiError(
            ErrorCode.PORT_UNREACHABLE,
            f"the server on port {port} in the sandbox did not answer the WebSocket"
            f" upgrade within {handshake_seconds:g} s",
        )
    except (OSError, InvalidHandshake, ValueError, asyncio.IncompleteReadError):
        writer.close()
        return ApiError(
            ErrorCode.PORT_UNREACHABLE,
            f"the server on port {port} in the sandbox refused the WebSocket",
        )
    try:
        if await receive() != {"type": "websocket.connect"}:
            return None
        await send(
            {
                "type": "websocket.accept",
                "subprotocol": response.headers.get("Sec-WebSocket-Protocol"),
            }
        )
        await _Relay(protocol, reader, writer, receive, send).run(idle_seconds)
    finally:
        writer.close()
    return None


async def _handshake(protocol: ClientProtocol, reader: asyncio.StreamReader) -> WsResponse:
    while True:
        data = await reader.read(READ_LIMIT)
        if data:
            protocol.receive_data(data)
        else:
            protocol.receive_eof()
        for event in protocol.events_received():
            if isinstance(event, WsResponse):
                if protocol.handshake_exc is not None:
                    raise protocol.handshake_exc
                return event
        if not data:
            raise ConnectionResetError("closed during the handshake")


def _client_code(code: int) -> int:
    """The close code to pass on from the client: its own where a peer may
    send it (1000, or an application's 3000-4999), else 1001 (going away)."""
    return code if code == 1000 or 3000 <= code <= 4999 else 1001


class _Relay:
    def __init__(
        self,
        protocol: ClientProtocol,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        receive: Receive,
        send: Send,
    ) -> None:
        self.protocol = protocol
        self.reader = reader
        self.writer = writer
        self.receive = receive
        self.send = send
        #: Set by each message either way (the idle timeout's clock).
        self.active = asyncio.Event()
        #: Whether the client's side is closed (by either end): nothing more is sent there.
        self.client_closed = False

    async def run(self, idle_seconds: float) -> None:
        inbound = asyncio.ensure_future(self._client_to_server())
        outbound = asyncio.ensure_future(self._server_to_client())
        idle = asyncio.ensure_future(self._idle(idle_seconds))
        try:
            done, _ = await asyncio.wait(
                {inbound, outbound, idle}, return_when=asyncio.FIRST_COMPLETED
            )
            if idle in done:
                await self._close_server(1001, "idle")
                await self._close_client(1001, "idle")
            elif outbound not in done:
                # The client left and the server was told: its close answer, briefly.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(outbound), CLOSE_SECONDS)
            else:
                await self._close_client(1011, "")
        finally:
            for task in (inbound, outbound, idle):
                task.cancel()
            for task in (inbound, outbound, idle):
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task

    async def _idle(self, seconds: float) -> None:
        """Returns once no message went either way for ``seconds``."""
        while True:
            try:
                await asyncio.wait_for(self.active.wait(), seconds)
            except TimeoutError:
                return
            self.active.clear()

    async def _flush(self) -> None:
        pending = self.protocol.data_to_send()
        if pending:
            self.writer.write(b"".join(pending))
            await self.writer.drain()

    async def _close_server(self, code: int, reason: str) -> None:
        with contextlib.suppress(InvalidState, OSError):
            self.protocol.send_close(code, reason)
            await self._flush()

    async def _close_client(self, code: int, reason: str) -> None:
        if self.client_closed:
            return
        self.client_closed = True
        try:
            await self.send({"type": "websocket.close", "code": code, "reason": reason})
        except Exception as exc:  # noqa: BLE001 - logged; the client may be gone already
            log.debug("port websocket: closing the client side failed: %r", exc)

    async def _client_to_server(self) -> None:
        while True:
            message = await self.receive()
            if message["type"] == "websocket.disconnect":
                self.client_closed = True
                code = _client_code(int(message.get("code") or 1000))
                await self._close_server(code, str(message.get("reason") or ""))
                return
            self.active.set()
            try:
                if message.get("bytes") is not None:
                    self.protocol.send_binary(message["bytes"])
                elif message.get("text") is not None:
                    self.protocol.send_text(message["text"].encode())
            except InvalidState:
                return  # the server's side is closing
            await self._flush()

    async def _server_to_client(self) -> None:
        """Until the server closes (its close passed on) or breaks the protocol
        (the client closed with the reason)."""
        parts: list[bytes] = []
        text = False
        while True:
            data = await self.reader.read(READ_LIMIT)
            if data:
                self.protocol.receive_data(data)
            else:
                self.protocol.receive_eof()
            for event in self.protocol.events_received():
                if not isinstance(event, Frame):
                    continue
                if event.opcode is Opcode.CLOSE:
                    await self._flush()  # the protocol's answer to it
                    received = self.protocol.close_rcvd
                    code = received.code if received is not None else 1000
                    reason = received.reason if received is not None else ""
                    await self._close_client(code if code != 1005 else 1000, reason)
                    return
                if event.opcode in (Opcode.TEXT, Opcode.BINARY):
                    text, parts = event.opcode is Opcode.TEXT, []
                elif event.opcode is not Opcode.CONT:
                    continue  # ping and pong: the protocol answers pings itself
                parts.append(bytes(event.data))
                if event.fin:
                    payload, parts = b"".join(parts), []
                    self.active.set()
                    if self.client_closed:
                        return
                    if text:
                        try:
                            decoded = payload.decode()
                        except UnicodeDecodeError:
                            await self._close_server(1007, "not UTF-8")
                            await self._close_client(1007, "the server sent text that is not UTF-8")
                            return
                        await self.send({"type": "websocket.send", "text": decoded})
                    else:
                        await self.send({"type": "websocket.send", "bytes": payload})
            broken = self.protocol.parser_exc
            with contextlib.suppress(OSError):
                await self._flush()  # a pong, or the close a broken frame earned
            if broken is not None:
                if isinstance(broken, PayloadTooBig):
                    await self._close_client(1009, "the server's message is too big")
                elif isinstance(broken, EOFError):
                    await self._close_client(1011, "the server closed its connection")
                else:
                    await self._close_client(1002, "the server broke the protocol")
                return
            if not data:
                await self._close_client(1011, "the server closed its connection")
                return
