"""Kept-alive HTTP/1.1 connections to one agent's unix socket.

A connection is used by one request at a time; idle ones wait here (at
most ``max_idle``). One whose peer has closed is dropped, never reused.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from podbay.wire.paths import INFO

Connection = tuple[asyncio.StreamReader, asyncio.StreamWriter]

#: The request a new connection is warmed with: the cheapest the agent answers.
_INFO = f"GET {INFO} HTTP/1.1\r\nhost: agent\r\n\r\n".encode()
#: Longest wait for that answer (a machine just started answers in ms).
PREWARM_SECONDS = 1.0
#: Largest answer :func:`exchange` reads (the agent's to info or to an exec of
#: ``true`` is a few hundred bytes).
MAX_ANSWER_BYTES = 64 * 1024


class AgentPool:
    def __init__(self, socket: Path, *, max_idle: int = 16) -> None:
        self.socket = socket
        self.max_idle = max_idle
        self._idle: list[Connection] = []
        self.closed = False

    async def acquire(self) -> Connection:
        while self._idle:
            reader, writer = self._idle.pop()
            if reader.at_eof() or writer.is_closing():
                writer.close()
                continue
            return reader, writer
        return await self.connect()

    async def connect(self) -> Connection:
        """A new connection (not from the idle ones)."""
        return await asyncio.open_unix_connection(str(self.socket), limit=1 << 20)

    async def prewarm(self) -> None:
        """Open one connection and have the agent answer one request on it before
        the first real request needs it (best effort): the agent has then taken
        the connection, started its thread for it and served on it, which a
        first request otherwise pays for (measured: up to a few ms under load)."""
        if self._idle or self.closed:
            return
        await self.answers(PREWARM_SECONDS)

    async def answers(self, seconds: float) -> bool:
        """Whether the agent answers ``GET /v1/info`` on a new connection within
        ``seconds`` (the connection is then kept)."""
        try:
            conn = await asyncio.wait_for(self._answered(), seconds)
        except (OSError, TimeoutError, ValueError, asyncio.IncompleteReadError):
            return False
        self.release(conn)
        return True

    async def _answered(self) -> Connection:
        """A new connection on which the agent has answered ``GET /v1/info``."""
        conn = await self.connect()
        try:
            await exchange(conn, _INFO)
        except BaseException:
            conn[1].close()
            raise
        return conn

    def release(self, conn: Connection) -> None:
        reader, writer = conn
        if (
            self.closed
            or len(self._idle) >= self.max_idle
            or reader.at_eof()
            or writer.is_closing()
        ):
            writer.close()
            return
        self._idle.append(conn)

    def close(self) -> None:
        self.closed = True
        idle, self._idle = self._idle, []
        for _, writer in idle:
            writer.close()


async def exchange(conn: Connection, request: bytes) -> bytes:
    """Send ``request`` (a whole HTTP/1.1 request) on ``conn`` and read the agent's
    answer; its body. ValueError unless it is a 200 with a ``Content-Length`` of
    at most :data:`MAX_ANSWER_BYTES`: for the host's own small calls (the
    prewarm, a warm pool's warm-up), not for relaying."""
    reader, writer = conn
    writer.write(request)
    head = await reader.readuntil(b"\r\n\r\n")
    status = head.split(b" ", 2)[1] if head.startswith(b"HTTP/1.1 ") else b""
    length = None
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    if status != b"200" or length is None or length > MAX_ANSWER_BYTES:
        raise ValueError("not the agent's answer")
    return await reader.readexactly(length)
