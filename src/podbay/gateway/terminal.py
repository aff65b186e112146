"""``/v1/pty``: a client's WebSocket, relayed to a terminal in the sandbox.

The client's first message (text) is a :class:`~podbay.wire.data.PtyRequest`.
The gateway starts it through the agent (:mod:`.upgrade`, ``podbay-pty``)
and then relays: binary messages from the client are terminal input, cut
into :mod:`podbay.wire.stream` frames; ``{"type": "resize", "rows", "cols"}``
text messages resize the terminal; terminal output goes back as binary
messages; when the command exits the client gets ``{"type": "exit",
"exit_code": N}`` and the WebSocket closes with 1000. A refusal (bad
request, command that cannot start, agent unreachable) is one text message
in the contract's refusal shape, then close 1008 (the request) or 1011 (the
sandbox). The client closing the WebSocket hangs the terminal up: the
command and what it started are killed.

Sizes are bounded on both legs: client messages by the server's WebSocket
limit, frames by :data:`~podbay.wire.stream.MAX_FRAME` (a larger one from
the agent ends the session).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import json
from collections.abc import Sequence
from pathlib import Path

from podbay.asgi import Receive, Send
from podbay.errors import ApiError, FrameError, WireError
from podbay.wire import paths, stream
from podbay.wire.codec import dumps, loads
from podbay.wire.codes import ErrorCode
from podbay.wire.data import PtyExit, PtyRequest, PtyResize

from .upgrade import upgrade

#: Close codes (RFC 6455): normal end, a request that cannot be served, a sandbox fault.
CLOSE_NORMAL = 1000
CLOSE_POLICY = 1008
CLOSE_ERROR = 1011


async def _refuse(send: Send, exc: ApiError) -> None:
    await send({"type": "websocket.send", "text": json.dumps(exc.body())})
    await send(
        {"type": "websocket.close", "code": CLOSE_ERROR if exc.status >= 500 else CLOSE_POLICY}
    )


async def session(
    socket: Path, receive: Receive, send: Send, headers: Sequence[tuple[bytes, bytes]] = ()
) -> None:
    """Serve one accepted WebSocket to its end."""
    first = await receive()
    if first["type"] != "websocket.receive":
        return
    try:
        text = first.get("text")
        if text is None:
            raise ApiError(
                ErrorCode.REQUEST_INVALID, "the first message must be a PtyRequest as JSON text"
            )
        try:
            request = loads(PtyRequest, text.encode(), strict=True)
        except WireError as exc:
            raise ApiError(ErrorCode.REQUEST_INVALID, f"invalid PtyRequest: {exc}") from None
        reader, writer = await upgrade(
            socket, "POST", paths.PTY, paths.UPGRADE_PTY, dumps(request), headers
        )
    except ApiError as exc:
        await _refuse(send, exc)
        return
    inbound = asyncio.ensure_future(_client_to_agent(receive, writer))
    outbound = asyncio.ensure_future(_agent_to_client(reader, send))
    try:
        done, _ = await asyncio.wait({inbound, outbound}, return_when=asyncio.FIRST_COMPLETED)
        if outbound in done:
            end = outbound.result()
            if end is not _End.CLIENT_GONE:
                code = CLOSE_NORMAL if end is _End.EXITED else CLOSE_ERROR
                with contextlib.suppress(*_CLIENT_GONE):  # it may leave meanwhile
                    await send({"type": "websocket.close", "code": code})
        else:
            with contextlib.suppress(ApiError):
                inbound.result()  # a client's bad message: its session ends
    finally:
        for task in (inbound, outbound):
            task.cancel()
        writer.close()  # the agent hangs the terminal up if it still runs


async def _client_to_agent(receive: Receive, writer: asyncio.StreamWriter) -> None:
    while True:
        message = await receive()
        if message["type"] != "websocket.receive":
            return
        data = message.get("bytes")
        if data:
            for frame in stream.data_frames(data):
                writer.write(frame)
        elif message.get("text") is not None:
            writer.write(_control(message["text"]))
        await writer.drain()


def _control(text: str) -> bytes:
    try:
        resize = loads(PtyResize, text.encode(), strict=True)
        return stream.resize_frame(resize.rows, resize.cols)
    except (WireError, FrameError) as exc:
        raise ApiError(ErrorCode.REQUEST_INVALID, f"invalid control message: {exc}") from None


class _End(enum.Enum):
    """How the relay to the client ended."""

    EXITED = "the command's exit was passed on"
    AGENT_BROKE_OFF = "the agent broke off"
    CLIENT_GONE = "the client went away (a disconnect, not an error)"


#: What the server's ``send`` raises once the client is gone: uvicorn's
#: ClientDisconnected (an OSError) mid-send, a RuntimeError after its close.
_CLIENT_GONE = (OSError, RuntimeError)


async def _agent_to_client(reader: asyncio.StreamReader, send: Send) -> _End:
    while True:
        try:
            kind, length = stream.parse_header(await reader.readexactly(stream.HEADER.size))
            payload = await reader.readexactly(length)
            if kind == stream.DATA:
                message = {"type": "websocket.send", "bytes": payload}
            elif kind == stream.EXIT:
                exit_message = PtyExit(exit_code=stream.parse_exit(payload))
                message = {"type": "websocket.send", "text": dumps(exit_message).decode()}
            else:
                raise FrameError("the agent sent a resize frame")
        except (OSError, asyncio.IncompleteReadError, FrameError):
            return _End.AGENT_BROKE_OFF
        try:
            await send(message)
        except _CLIENT_GONE:
            return _End.CLIENT_GONE
        if kind == stream.EXIT:
            return _End.EXITED
