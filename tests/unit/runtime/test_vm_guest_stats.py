"""The vm guest figures reader over a kept connection, against a fake agent
on a unix socket: one connection for many readings, hostile answers refused."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from podbay.errors import AgentUnreachable
from podbay.runtime.vm.guest_stats import GuestStats

pytestmark = pytest.mark.anyio

BODY = (
    b'{"memory_bytes": 5, "memory_total_bytes": 9, "disk_bytes": 1,'
    b' "net_rx_bytes": 2, "net_tx_bytes": 3, "oom_kills": 0}'
)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_readings_share_one_connection_and_a_bad_answer_drops_it(tmp_path: Path) -> None:
    connections: list[int] = []
    answers = [b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(BODY), BODY)] * 2
    answers.append(b"HTTP/1.1 200 OK\r\nContent-Length: 99999999\r\n\r\n")
    answers.append(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(BODY), BODY))

    async def agent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(1)
        while answers:
            try:
                await reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError:
                break
            writer.write(answers.pop(0))
            await writer.drain()
        writer.close()

    socket = tmp_path / "agent.sock"
    server = await asyncio.start_unix_server(agent, str(socket))
    stats = GuestStats()
    try:
        first = await stats.read("m1", socket, 2.0)
        second = await stats.read("m1", socket, 2.0)
        assert (first.memory_bytes, second.net_tx_bytes) == (5, 3)
        assert len(connections) == 1
        with pytest.raises(AgentUnreachable):
            await stats.read("m1", socket, 2.0)  # a body past the bound: refused
        assert (await stats.read("m1", socket, 2.0)).disk_bytes == 1  # a new connection
        assert len(connections) == 2
    finally:
        await stats.close()
        server.close()
        await server.wait_closed()
