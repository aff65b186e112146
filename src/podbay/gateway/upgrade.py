"""The gateway's leg of terminals and ports: an HTTP/1.1 upgrade on a fresh
connection to the agent (never a pooled one: the connection is consumed).

The agent's answer is hostile input like any other: its head is bounded
(:data:`MAX_HEAD`), a refusal's body too (:data:`MAX_REFUSAL`), and only a
refusal in the contract's shape keeps its code; anything else is 502
``AGENT_UNREACHABLE``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from pathlib import Path

from podbay.errors import ApiError
from podbay.wire.codes import ErrorCode

MAX_HEAD = 16 * 1024
MAX_REFUSAL = 64 * 1024
#: Reads on an upgraded connection return at most this much at once.
READ_LIMIT = 256 * 1024

Stream = tuple[asyncio.StreamReader, asyncio.StreamWriter]


def unreachable() -> ApiError:
    return ApiError(ErrorCode.AGENT_UNREACHABLE, "the sandbox's agent did not answer")


async def upgrade(
    socket: Path,
    method: str,
    target: str,
    token: str,
    body: bytes = b"",
    headers: Sequence[tuple[bytes, bytes]] = (),
) -> Stream:
    """The upgraded connection; :class:`ApiError` with the agent's refusal or
    ``AGENT_UNREACHABLE``."""
    try:
        reader, writer = await asyncio.open_unix_connection(str(socket), limit=READ_LIMIT)
    except OSError:
        raise unreachable() from None
    try:
        extra = b"".join(name + b": " + value + b"\r\n" for name, value in headers)
        writer.write(
            f"{method} {target} HTTP/1.1\r\nhost: agent\r\nconnection: upgrade\r\n"
            f"upgrade: {token}\r\ncontent-length: {len(body)}\r\n".encode()
            + extra
            + b"\r\n"
            + body
        )
        await writer.drain()
        head = await _read_head(reader)
        status_line, _, header_block = head.partition(b"\r\n")
        parts = status_line.split(b" ", 2)
        if len(parts) < 2 or not parts[1].isdigit():
            raise unreachable()
        status = int(parts[1])
        if status == 101:
            return reader, writer
        raise await _refusal(reader, header_block)
    except BaseException as exc:
        writer.close()
        if isinstance(exc, ApiError | asyncio.CancelledError):
            raise
        if isinstance(
            exc, OSError | asyncio.IncompleteReadError | asyncio.LimitOverrunError | ValueError
        ):
            raise unreachable() from None
        raise


async def _read_head(reader: asyncio.StreamReader) -> bytes:
    head = bytearray()
    while not head.endswith(b"\r\n\r\n"):
        line = await reader.readuntil(b"\n")
        head += line
        if len(head) > MAX_HEAD:
            raise ValueError("answer head too large")
    return bytes(head[:-4])


async def _refusal(reader: asyncio.StreamReader, header_block: bytes) -> ApiError:
    length = 0
    for line in header_block.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length" and value.strip().isdigit():
            length = int(value.strip())
    if not 0 < length <= MAX_REFUSAL:
        return unreachable()
    try:
        body = json.loads(await reader.readexactly(length))
        code = ErrorCode(body["code"])
        message = body["error"]
    except (ValueError, KeyError, TypeError, RecursionError):
        return unreachable()
    if not isinstance(message, str):
        return unreachable()
    return ApiError(code, message[:4096])
