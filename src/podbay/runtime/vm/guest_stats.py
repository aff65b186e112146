"""A ``vm`` guest's own figures (``GET /v1/stats``) over one kept connection
per machine, for the node's metrics sampling every 2 s.

A new connection per reading (:class:`~podbay.runtime.agent_client.AgentClient`)
costs the host a connect through the machine's relay and a thread each time:
~2.3 ms of CPU per reading, above the 0.1 %-of-a-core budget per sandbox
(bench/metrics_cost.py). Kept open, a reading is one small request and
answer on the event loop. The answer is the guest's (hostile): its head and
body are read to small bounds, and any fault drops the connection (the next
reading opens another).
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

from podbay.errors import AgentUnreachable
from podbay.wire import codec
from podbay.wire.data import AgentStats
from podbay.wire.paths import STATS

REQUEST = f"GET {STATS} HTTP/1.1\r\nHost: agent\r\n\r\n".encode()
#: Largest head and body read: the figures are a hundred bytes.
MAX_HEAD = 4096
MAX_BODY = 4096


class GuestStats:
    def __init__(self) -> None:
        self._open: dict[str, tuple[asyncio.StreamReader, asyncio.StreamWriter]] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    async def read(self, machine_id: str, socket: Path, within: float) -> AgentStats:
        lock = self._locks.setdefault(machine_id, asyncio.Lock())
        async with lock:
            try:
                return await asyncio.wait_for(self._ask(machine_id, socket), within)
            except (OSError, ValueError, TimeoutError, asyncio.IncompleteReadError) as exc:
                self.drop(machine_id)
                raise AgentUnreachable(f"guest figures of {machine_id}: {exc!r}") from None
            except BaseException:
                self.drop(machine_id)
                raise

    async def _ask(self, machine_id: str, socket: Path) -> AgentStats:
        conn = self._open.get(machine_id)
        if conn is None:
            conn = await asyncio.open_unix_connection(str(socket), limit=MAX_HEAD)
            self._open[machine_id] = conn
        reader, writer = conn
        writer.write(REQUEST)
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
        status_line, *fields = head.decode("latin-1").split("\r\n")
        if status_line.split(" ")[1:2] != ["200"]:
            raise ValueError(f"answered {status_line[:80]!r}")
        length = next(
            (
                v.strip()
                for k, _, v in (f.partition(":") for f in fields)
                if k.lower() == "content-length"
            ),
            "",
        )
        if not length.isdigit() or int(length) > MAX_BODY:
            raise ValueError(f"content-length {length[:20]!r}")
        body = await reader.readexactly(int(length))
        return codec.loads(AgentStats, body, strict=False)

    def drop(self, machine_id: str) -> None:
        conn = self._open.pop(machine_id, None)
        if conn is not None:
            conn[1].close()

    def forget(self, machine_id: str) -> None:
        """The machine stopped or went: its connection and lock too."""
        self.drop(machine_id)
        self._locks.pop(machine_id, None)

    async def close(self) -> None:
        for machine_id in list(self._open):
            _, writer = self._open.pop(machine_id)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()


def _content_length(fields: list[str]) -> str:
    for field in fields:
        name, _, value = field.partition(":")
        if name.strip().lower() == "content-length":
            return value.strip()
    return ""
