"""A hijacked agent answers the gateway: its answer is bounded, and what the
client sent for the platform (Authorization, cookies) never reaches it.

Code in a sandbox that takes over the agent's socket can answer the gateway
with anything; here a hostile server on a unix socket plays that part.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from podbay.dataplane.agentpool import AgentPool
from podbay.gateway.proxy import relay

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]

# The agent pools the tests made, closed after each test: a kept agent connection
# left open is a leaked socket (and a warning, an error here).
_pools: list[AgentPool] = []


@pytest.fixture(autouse=True)
async def _close_pools() -> AsyncIterator[None]:
    yield
    while _pools:
        _pools.pop().close()
    await asyncio.sleep(0)  # the transports' own closing, on this loop


def _pool(path: Path) -> AgentPool:
    pool = AgentPool(path)
    _pools.append(pool)
    return pool


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Sink:
    def __init__(self) -> None:
        self.messages: list[dict] = []  # type: ignore[type-arg]

    async def __call__(self, message: dict) -> None:  # type: ignore[type-arg]
        self.messages.append(message)

    @property
    def status(self) -> int:
        return int(self.messages[0]["status"])

    @property
    def headers(self) -> list[tuple[bytes, bytes]]:
        return list(self.messages[0]["headers"])

    @property
    def body(self) -> bytes:
        return b"".join(m.get("body", b"") for m in self.messages[1:])


def scope(method: str = "GET", headers: list[tuple[bytes, bytes]] | None = None) -> dict:  # type: ignore[type-arg]
    return {"type": "http", "method": method, "headers": headers or []}


def no_body():  # type: ignore[no-untyped-def]
    """A GET's receive: its empty body, then nothing until the client leaves."""
    sent = False

    async def receive() -> dict:  # type: ignore[type-arg]
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    return receive


async def hostile_agent(path: Path, answer_chunks, heads: list[bytes], written: list[int]):  # type: ignore[no-untyped-def]
    """Reads one request head, then writes ``answer_chunks`` until the peer stops reading."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        heads.append(await reader.readuntil(b"\r\n\r\n"))
        total = 0
        try:
            for chunk in answer_chunks:
                writer.write(chunk)
                await writer.drain()
                total += len(chunk)
        except (ConnectionError, OSError):
            pass
        finally:
            written.append(total)
            writer.close()

    return await asyncio.start_unix_server(handle, path=str(path))


async def test_endless_answer_head_is_cut_off_and_answered_502(tmp_path: Path) -> None:
    """One answer of 64 MiB of headers used to be buffered whole (1 GiB took the
    server from 58 MiB to 1.1 GiB); now the gateway stops reading at its limit."""
    total = 64 * 1024 * 1024
    line = b"x-filler: " + b"a" * 1000 + b"\r\n"

    def chunks():  # type: ignore[no-untyped-def]
        yield b"HTTP/1.1 200 OK\r\n"
        sent = 0
        while sent < total:
            yield line * 64
            sent += len(line) * 64

    heads: list[bytes] = []
    written: list[int] = []
    server = await hostile_agent(tmp_path / "a.sock", chunks(), heads, written)
    sink = Sink()
    status = await relay(_pool(tmp_path / "a.sock"), scope(), no_body(), sink, b"/v1/info", "rid")
    for _ in range(1000):  # the hostile side notices the gateway hung up
        if written:
            break
        await asyncio.sleep(0.01)
    server.close()
    assert status == 502
    assert sink.status == 502
    assert b"AGENT_UNREACHABLE" in sink.body
    # What the agent got rid of: the gateway's reads plus socket buffers, far
    # below what it tried to send.
    assert written
    assert written[0] < 17 * 1024 * 1024 < total


async def test_too_many_answer_headers_is_502(tmp_path: Path) -> None:
    answer = b"HTTP/1.1 200 OK\r\n" + b"a: b\r\n" * 10_000 + b"content-length: 2\r\n\r\n{}"
    server = await hostile_agent(tmp_path / "a.sock", [answer], [], [])
    sink = Sink()
    status = await relay(_pool(tmp_path / "a.sock"), scope(), no_body(), sink, b"/v1/info", "rid")
    server.close()
    assert status == 502
    assert b"AGENT_UNREACHABLE" in sink.body
    assert len(sink.headers) < 10


@pytest.mark.parametrize(
    "status_line", [b"HTTP/1.1 101 Switching Protocols", b"HTTP/1.1 100 Continue"]
)
async def test_non_final_status_is_502(tmp_path: Path, status_line: bytes) -> None:
    answer = status_line + b"\r\ncontent-length: 0\r\n\r\n"
    server = await hostile_agent(tmp_path / "a.sock", [answer], [], [])
    sink = Sink()
    status = await relay(_pool(tmp_path / "a.sock"), scope(), no_body(), sink, b"/v1/info", "rid")
    server.close()
    assert status == 502
    assert sink.status == 502


async def test_answer_headers_that_act_on_the_client_are_dropped(tmp_path: Path) -> None:
    answer = (
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
        b"set-cookie: session=stolen; Path=/\r\nlocation: http://evil.example/\r\n"
        b"x-podbay-sha256: abc\r\ncontent-length: 2\r\n\r\n{}"
    )
    server = await hostile_agent(tmp_path / "a.sock", [answer], [], [])
    sink = Sink()
    status = await relay(_pool(tmp_path / "a.sock"), scope(), no_body(), sink, b"/v1/info", "rid")
    server.close()
    names = {k for k, _ in sink.headers}
    assert status == 200
    assert sink.body == b"{}"
    assert b"set-cookie" not in names
    assert b"location" not in names
    assert {b"content-type", b"x-podbay-sha256", b"x-request-id"} <= names


async def test_client_authorization_and_cookies_never_reach_the_agent(tmp_path: Path) -> None:
    heads: list[bytes] = []
    answer = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}"
    server = await hostile_agent(tmp_path / "a.sock", [answer], heads, [])
    sink = Sink()
    await relay(
        _pool(tmp_path / "a.sock"),
        scope(
            headers=[
                (b"authorization", b"Bearer identity-token-secret"),
                (b"cookie", b"session=cookie-secret"),
                (b"x-podbay-credential", b"credential-secret"),
                (b"x-other", b"kept"),
            ]
        ),
        no_body(),
        sink,
        b"/v1/info",
        "rid",
    )
    server.close()
    head = heads[0].lower()
    assert b"secret" not in head
    assert b"x-other: kept" in head


async def test_agent_that_never_answers_is_let_go_when_the_client_leaves(tmp_path: Path) -> None:
    """A hijacked agent reads the request and never answers: once the client
    leaves, the gateway closes that connection (it used to wait for ever)."""
    asked = asyncio.Event()
    closed = asyncio.Event()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        asked.set()
        await reader.read()  # until the gateway hangs up
        closed.set()
        writer.close()

    server = await asyncio.start_unix_server(handle, path=str(tmp_path / "a.sock"))
    leave = asyncio.Event()
    sent = False

    async def receive() -> dict:  # type: ignore[type-arg]
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await leave.wait()
        return {"type": "http.disconnect"}

    sink = Sink()
    relaying = asyncio.create_task(
        relay(_pool(tmp_path / "a.sock"), scope(), receive, sink, b"/v1/exec", "rid")
    )
    await asyncio.wait_for(asked.wait(), 30)
    leave.set()
    assert await asyncio.wait_for(relaying, 30) == 499
    await asyncio.wait_for(closed.wait(), 30)
    server.close()
