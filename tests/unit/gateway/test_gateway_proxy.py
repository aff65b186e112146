"""The raw relay against hand-written agent answers."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import socket
from collections.abc import AsyncIterator, Iterator

import pytest

from podbay.asgi import RESPONSE_GATHER
from podbay.dataplane.agentpool import AgentPool
from podbay.gateway.proxy import relay

pytestmark = pytest.mark.anyio

# Pools and agent connections the tests made, closed after each test: a
# transport left open is a leaked socket (and a warning, an error here).
_pools: list[AgentPool] = []


@pytest.fixture(autouse=True)
async def _close_pools() -> AsyncIterator[None]:
    yield
    while _pools:
        _pools.pop().close()
    await asyncio.sleep(0)  # the transports' own closing, on this loop


def _pool(path):  # type: ignore[no-untyped-def]
    pool = AgentPool(path)
    _pools.append(pool)
    return pool


async def _serve(handle, path):  # type: ignore[no-untyped-def]
    """A unix server whose connections are closed however ``handle`` ends."""

    async def closing(reader, writer):  # type: ignore[no-untyped-def]
        try:
            await handle(reader, writer)
        finally:
            writer.close()

    return await asyncio.start_unix_server(closing, path=str(path))


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def _agent(path, answers, seen):  # type: ignore[no-untyped-def]
    """Serve ``answers`` (raw bytes, or None to hang up) one per request, in order;
    a request past them is hung up on."""

    async def handle(reader, writer):  # type: ignore[no-untyped-def]
        try:
            while answers:
                head = await reader.readuntil(b"\r\n\r\n")
                body = b""
                low = head.lower()
                if b"content-length:" in low:
                    n = int(low.split(b"content-length:")[1].split(b"\r\n")[0])
                    body = await reader.readexactly(n)
                elif b"transfer-encoding: chunked" in low:
                    while True:
                        size = int((await reader.readuntil(b"\r\n")).strip(), 16)
                        chunk = await reader.readexactly(size + 2)
                        if size == 0:
                            break
                        body += chunk[:-2]
                seen.append((head, body, id(writer)))
                # Another connection may have taken the last answer meanwhile.
                answer = answers.pop(0) if answers else None
                if answer is None:
                    writer.close()
                    return
                writer.write(answer)
                await writer.drain()
        except asyncio.IncompleteReadError:
            pass
        writer.close()

    return await _serve(handle, path)


def _scope(method="POST", headers=()):  # type: ignore[no-untyped-def]
    return {"type": "http", "method": method, "headers": list(headers)}


def _receive(chunks):  # type: ignore[no-untyped-def]
    messages = [
        {"type": "http.request", "body": c, "more_body": i < len(chunks) - 1}
        for i, c in enumerate(chunks)
    ] or [{"type": "http.request", "body": b""}]

    async def receive():  # type: ignore[no-untyped-def]
        if messages:
            return messages.pop(0)
        await asyncio.Event().wait()  # as a server does: nothing until the client leaves

    return receive


class _Sink:
    def __init__(self) -> None:
        self.messages: list[dict] = []

    async def __call__(self, message: dict) -> None:
        self.messages.append(message)

    @property
    def status(self) -> int:
        return self.messages[0]["status"]

    @property
    def headers(self) -> dict[bytes, bytes]:
        return dict(self.messages[0]["headers"])

    @property
    def body(self) -> bytes:
        return b"".join(m.get("body", b"") for m in self.messages[1:])


OK = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"


async def test_length_body_keepalive_reuse(tmp_path):
    seen: list = []
    server = await _agent(tmp_path / "a.sock", [OK, OK], seen)
    pool = _pool(tmp_path / "a.sock")
    for _ in range(2):
        sink = _Sink()
        status = await relay(
            pool,
            _scope(
                headers=[
                    (b"content-length", b"5"),
                    (b"x-podbay-credential", b"secret"),
                    (b"x-custom", b"1"),
                ]
            ),
            _receive([b"he", b"llo"]),
            sink,
            b"/v1/exec?a=1",
            "rid",
        )
        assert status == 200
        assert sink.body == b"{}"
        assert sink.headers[b"x-request-id"] == b"rid"
    head, body, _ = seen[0]
    assert head.startswith(b"POST /v1/exec?a=1 HTTP/1.1\r\n")
    assert b"secret" not in head
    assert b"x-custom: 1" in head
    assert body == b"hello"
    assert seen[0][2] == seen[1][2]  # one connection, kept alive
    server.close()


async def test_chunked_both_ways(tmp_path):
    seen: list = []
    answer = (
        b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n4\r\ndefg\r\n0\r\n\r\n"
    )
    server = await _agent(tmp_path / "a.sock", [answer], seen)
    sink = _Sink()
    status = await relay(
        _pool(tmp_path / "a.sock"),
        _scope("PUT", [(b"transfer-encoding", b"chunked")]),
        _receive([b"x" * 10, b"y" * 5]),
        sink,
        b"/v1/files",
        "r",
    )
    assert status == 200
    assert sink.body == b"abcdefg"
    assert b"transfer-encoding" not in sink.headers
    assert seen[0][1] == b"x" * 10 + b"y" * 5
    server.close()


async def test_agent_hangs_up_before_answering(tmp_path):
    server = await _agent(tmp_path / "a.sock", [None], [])
    sink = _Sink()
    status = await relay(
        _pool(tmp_path / "a.sock"), _scope("GET"), _receive([]), sink, b"/v1/info", "r"
    )
    assert status == 502
    assert b"AGENT_UNREACHABLE" in sink.body
    server.close()


async def test_no_agent_socket(tmp_path):
    sink = _Sink()
    status = await relay(
        _pool(tmp_path / "none.sock"), _scope("GET"), _receive([]), sink, b"/v1/info", "r"
    )
    assert status == 502
    assert b"AGENT_UNREACHABLE" in sink.body


async def test_connection_close_answer_is_not_reused(tmp_path):
    seen: list = []
    closing = b"HTTP/1.1 204 No Content\r\nconnection: close\r\n\r\n"
    server = await _agent(tmp_path / "a.sock", [closing], seen)
    pool = _pool(tmp_path / "a.sock")
    sink = _Sink()
    assert await relay(pool, _scope("DELETE"), _receive([]), sink, b"/v1/processes/1", "r") == 204
    assert pool._idle == []
    server.close()


async def test_large_response_streams_in_chunks(tmp_path):
    size = 8 * 1024 * 1024
    answer = b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % size + b"z" * size
    server = await _agent(tmp_path / "a.sock", [answer], [])
    sink = _Sink()
    await relay(_pool(tmp_path / "a.sock"), _scope("GET"), _receive([]), sink, b"/v1/files", "r")
    sizes = [len(m.get("body", b"")) for m in sink.messages[1:]]
    assert sum(sizes) == size
    assert max(sizes) <= 1 << 20
    assert sink.headers[b"content-length"] == str(size).encode()
    server.close()


@pytest.mark.parametrize("body", [b"", b'{"command":["true"]}'])
async def test_kept_connection_shut_by_the_agent_is_replaced(tmp_path, body):
    """An agent that stops reading a kept-alive connection (a hibernating agent
    shuts them): the next request's write fails there, and it goes out on a new
    connection instead of being lost, with the body that went with its head."""
    seen: list = []
    shut = asyncio.Event()

    async def handle(reader, writer):  # type: ignore[no-untyped-def]
        head = await reader.readuntil(b"\r\n\r\n")
        received = await reader.readexactly(len(body))
        seen.append((head, id(writer), received))
        writer.write(OK)
        await writer.drain()
        if len(seen) == 1:
            # Stop reading, keep the connection open: the gateway sees no EOF.
            writer.get_extra_info("socket").shutdown(socket.SHUT_RD)
            shut.set()
            await asyncio.sleep(5)
        writer.close()

    server = await _serve(handle, tmp_path / "a.sock")
    pool = _pool(tmp_path / "a.sock")
    method = "POST" if body else "GET"
    headers = [(b"content-length", str(len(body)).encode())] if body else []
    for n in range(2):
        sink = _Sink()
        scope = _scope(method, headers)
        status = await relay(pool, scope, _receive([body]), sink, b"/v1/info", f"r{n}")
        assert status == 200
        assert sink.body == b"{}"
        await shut.wait()
    first = f"{method} /v1/info HTTP/1.1".encode()
    assert [head.split(b"\r\n")[0] for head, _, _ in seen] == [first] * 2
    assert seen[0][1] != seen[1][1]  # the second went out on a new connection
    assert [received for _, _, received in seen] == [body, body]
    server.close()


class _CountingPool(AgentPool):
    """Records every write the relay makes on its agent connections."""

    def __init__(self, socket_path):  # type: ignore[no-untyped-def]
        super().__init__(socket_path)
        _pools.append(self)
        self.writes: list[bytes] = []
        self.connects = 0

    async def connect(self):  # type: ignore[no-untyped-def]
        self.connects += 1
        reader, writer = await super().connect()
        write = writer.write

        def recorded(data):  # type: ignore[no-untyped-def]
            self.writes.append(bytes(data))
            write(data)

        writer.write = recorded  # type: ignore[method-assign]
        return reader, writer


async def test_a_small_body_goes_out_in_one_write_with_its_head(tmp_path):
    """An exec's JSON body and its head reach the agent in one write (one wake-up
    of the agent, one send here), not two."""
    seen: list = []
    server = await _agent(tmp_path / "a.sock", [OK], seen)
    pool = _CountingPool(tmp_path / "a.sock")
    body = b'{"command":["true"]}'
    sink = _Sink()
    headers = [(b"content-length", str(len(body)).encode())]
    status = await relay(pool, _scope(headers=headers), _receive([body]), sink, b"/v1/exec", "r")
    assert status == 200
    assert sink.body == b"{}"
    assert len(pool.writes) == 1, pool.writes
    assert pool.writes[0].startswith(b"POST /v1/exec HTTP/1.1\r\n")
    assert pool.writes[0].endswith(b"\r\n\r\n" + body)
    assert seen[0][1] == body
    server.close()


async def test_a_client_gone_before_its_body_never_reaches_the_agent(tmp_path):
    pool = _CountingPool(tmp_path / "a.sock")
    server = await _agent(tmp_path / "a.sock", [OK], [])

    async def receive():  # type: ignore[no-untyped-def]
        return {"type": "http.disconnect"}

    headers = [(b"content-length", b"20")]
    sink = _Sink()
    assert await relay(pool, _scope(headers=headers), receive, sink, b"/v1/exec", "r") == 499
    assert pool.connects == 0
    assert sink.messages == []
    server.close()


async def test_an_answer_before_the_body_is_relayed(tmp_path):
    """An agent that refuses a large upload from its head (a full disk) answers and
    hangs up without reading the body: the client gets that answer, not a 502."""
    body = b'{"code":"NO_SPACE"}'
    refusal = b"HTTP/1.1 507 Insufficient Storage\r\ncontent-length: 19\r\n\r\n" + body

    async def handle(reader, writer):  # type: ignore[no-untyped-def]
        await reader.readuntil(b"\r\n\r\n")
        writer.write(refusal)
        await writer.drain()
        writer.close()

    server = await _serve(handle, tmp_path / "a.sock")
    size = 64 * 1024 * 1024
    sink = _Sink()
    status = await relay(
        _pool(tmp_path / "a.sock"),
        _scope("PUT", [(b"content-length", str(size).encode())]),
        _receive([b"z" * (1024 * 1024)] * 64),
        sink,
        b"/v1/files?path=big",
        "r",
    )
    assert status == 507
    assert sink.body == body
    server.close()


@pytest.mark.parametrize("busy", [False, True])
async def test_a_large_body_is_offered_for_splicing_unless_too_many_are(
    tmp_path, monkeypatch, busy
):  # type: ignore[no-untyped-def]
    """The listener's takeover is asked for (here it declines: the body comes
    through ``receive`` after all); with MAX_AT_ONCE splices running it is not."""
    from podbay.asgi import BODY_TAKEOVER
    from podbay.gateway import splice

    if busy:
        monkeypatch.setattr(splice, "_running", splice.MAX_AT_ONCE)
    asked: list[bool] = []
    seen: list = []
    server = await _agent(tmp_path / "a.sock", [OK], seen)
    body = [b"a" * 100_000, b"b" * 100_000]  # past what goes out with the head
    scope = _scope("PUT", [(b"content-length", b"200000")])
    scope["extensions"] = {BODY_TAKEOVER: lambda: asked.append(True)}
    sink = _Sink()
    status = await relay(_pool(tmp_path / "a.sock"), scope, _receive(body), sink, b"/v1/files", "r")
    assert status == 200
    assert seen[0][1] == b"".join(body)
    assert asked == ([] if busy else [True])
    server.close()


class _Gather:
    """The listener's RESPONSE_GATHER stand-in: records which messages were sent
    while it was open."""

    def __init__(self, sink: _Sink) -> None:
        self.sink = sink
        self.spans: list[tuple[int, int]] = []

    @contextlib.contextmanager
    def __call__(self) -> Iterator[None]:
        start = len(self.sink.messages)
        yield
        self.spans.append((start, len(self.sink.messages)))


async def test_an_answer_in_hand_is_sent_gathered_into_one_write(tmp_path):
    seen: list = []
    slow_head = b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n"
    server = await _agent(tmp_path / "a.sock", [OK], seen)
    sink = _Sink()
    gather = _Gather(sink)
    scope = {**_scope(), "extensions": {RESPONSE_GATHER: gather}}
    status = await relay(_pool(tmp_path / "a.sock"), scope, _receive([]), sink, b"/x", "r")
    assert status == 200
    assert sink.body == b"{}"
    # Head, body and end: all sent while gathered (the listener writes them as one).
    assert gather.spans == [(0, len(sink.messages))]
    assert len(sink.messages) == 3
    server.close()

    # An answer whose body comes later is relayed as it comes: not gathered.
    async def handle(reader, writer):  # type: ignore[no-untyped-def]
        await reader.readuntil(b"\r\n\r\n")
        writer.write(slow_head)
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.write(b"{}")
        await writer.drain()
        writer.close()

    slow = await _serve(handle, tmp_path / "b.sock")
    sink = _Sink()
    gather = _Gather(sink)
    scope = {**_scope(), "extensions": {RESPONSE_GATHER: gather}}
    status = await relay(_pool(tmp_path / "b.sock"), scope, _receive([]), sink, b"/x", "r")
    assert status == 200
    assert sink.body == b"{}"
    assert gather.spans == []
    slow.close()


async def test_a_relayed_answer_leaves_no_garbage_cycle(tmp_path):
    """The answer's parser and the object collecting its callbacks part once the
    answer is whole: they held each other, a reference cycle per relayed answer
    that only the garbage collector freed."""
    from podbay.gateway import proxy

    seen: list = []
    server = await _agent(tmp_path / "a.sock", [OK], seen)
    gc.collect()
    gc.disable()
    try:
        status = await relay(
            _pool(tmp_path / "a.sock"), _scope(), _receive([]), _Sink(), b"/x", "r"
        )
        assert status == 200
        assert not [o for o in gc.get_objects() if isinstance(o, proxy._Response)]
    finally:
        gc.enable()
        server.close()
