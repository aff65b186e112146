"""Is the agent up? One ``GET /v1/info`` over its socket, answered 200.

The host made the listening socket before the container started, so a
connect succeeds at once and the request simply waits in the backlog until
the agent serves it: no polling. If the agent dies first, the socket's last
holder is gone and the connection fails right away.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from ..wire.paths import INFO
from .base import DriverError

REQUEST = f"GET {INFO} HTTP/1.1\r\nHost: agent\r\nConnection: close\r\n\r\n".encode()


async def probe(socket_path: Path, within: float) -> int:
    """The HTTP status ``GET /v1/info`` gets; raises ``OSError``/``TimeoutError``."""
    async with asyncio.timeout(within):
        reader, writer = await asyncio.open_unix_connection(str(socket_path))
        try:
            writer.write(REQUEST)
            await writer.drain()
            line = await reader.readline()
        finally:
            writer.close()
    parts = line.split()
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/"):
        raise ConnectionError(f"not an HTTP answer: {line[:80]!r}")
    return int(parts[1])


async def wait_ready(socket_path: Path, within: float) -> None:
    """Return once the agent answers ``/v1/info`` with 200, or raise :class:`DriverError`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    last = "no answer"
    while True:
        remaining = deadline - loop.time()
        if remaining <= 0:
            raise DriverError(f"agent did not answer within {within:.0f} s ({last})")
        try:
            status = await probe(socket_path, remaining)
        except TimeoutError:
            # A probe cut short by the deadline says less than an answer the
            # agent gave before it: keep that one.
            if last == "no answer":
                last = "timed out"
            continue
        except (OSError, ConnectionError) as e:
            raise DriverError(f"agent is not answering ({e})") from None
        if status == 200:
            return
        last = f"/v1/info answered {status}"
        await asyncio.sleep(0.01)
