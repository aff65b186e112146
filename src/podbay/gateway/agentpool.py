"""Kept-alive HTTP/1.1 connections to one agent's unix socket.

A connection is used by one request at a time; idle ones wait here (at
most ``max_idle``). One whose peer has closed is dropped, never reused.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

Connection = tuple[asyncio.StreamReader, asyncio.StreamWriter]


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
        """Open one connection before the first request needs it (best effort):
        the agent then has its connection thread running when that request comes."""
        if self._idle or self.closed:
            return
        try:
            conn = await self.connect()
        except OSError:
            return
        self.release(conn)

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
