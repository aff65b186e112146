"""The blocking client's default transport (``podbay.client._transport``), against
a raw-socket HTTP server in a thread: it records every ``recv`` it gets, so the
tests see what went over the wire and in how many writes."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable, Iterator

import httpx
import pytest

from podbay.client._transport import StdlibTransport

Answer = Callable[[bytes], bytes]


class RawServer:
    """Answers each request on a connection with ``answer(request bytes)``;
    ``close_after`` closes the connection after that many answers."""

    def __init__(self, answer: Answer, close_after: int | None = None) -> None:
        self.answer = answer
        self.close_after = close_after
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.connections = 0
        #: Every recv's bytes, per connection.
        self.reads: list[list[bytes]] = []
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            reads: list[bytes] = []
            self.reads.append(reads)
            threading.Thread(target=self._serve, args=(sock, reads), daemon=True).start()

    def _serve(self, sock: socket.socket, reads: list[bytes]) -> None:
        buf = b""
        answered = 0
        with sock, contextlib.suppress(OSError):
            while True:
                while b"\r\n\r\n" not in buf:
                    data = sock.recv(65536)
                    if not data:
                        return
                    reads.append(data)
                    buf += data
                head, _, buf = buf.partition(b"\r\n\r\n")
                length = 0
                chunked = False
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                    if name.strip().lower() == b"transfer-encoding":
                        chunked = True
                if chunked:
                    while not buf.endswith(b"0\r\n\r\n"):
                        data = sock.recv(65536)
                        reads.append(data)
                        buf += data
                    body, buf = buf, b""
                else:
                    while len(buf) < length:
                        data = sock.recv(65536)
                        reads.append(data)
                        buf += data
                    body, buf = buf[:length], buf[length:]
                sock.sendall(self.answer(head + b"\r\n\r\n" + body))
                answered += 1
                if self.close_after is not None and answered >= self.close_after:
                    return

    def close(self) -> None:
        self.listener.close()


def ok(body: bytes = b'{"ok": true}') -> Answer:
    def answer(_: bytes) -> bytes:
        return b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%b" % (len(body), body)

    return answer


@pytest.fixture
def http() -> Iterator[httpx.Client]:
    with httpx.Client(transport=StdlibTransport(), timeout=5) as client:
        yield client


def test_keeps_the_connection_alive_and_sends_head_and_body_in_one_write(
    http: httpx.Client,
) -> None:
    server = RawServer(ok())
    for _ in range(20):
        r = http.post(server.url + "/v1/exec?x=1", json={"command": ["true"]})
        assert r.status_code == 200
        assert r.json() == {"ok": True}
    assert server.connections == 1
    # Each request arrived in one read: head and JSON body left in one write (two
    # writes reach a server waiting in recv as two reads, most times in 20).
    assert len(server.reads[0]) == 20
    for read in server.reads[0]:
        assert read.startswith(b"POST /v1/exec?x=1 HTTP/1.1\r\n")
        assert read.endswith(b'{"command":["true"]}')
        assert read.lower().count(b"host: 127.0.0.1") == 1
    server.close()


def test_a_connection_the_server_closed_while_idle_is_not_reused(http: httpx.Client) -> None:
    server = RawServer(ok(), close_after=1)
    assert http.get(server.url + "/a").status_code == 200
    # The server has closed its end; without the check the next request would be
    # written to a dead connection and fail (a transport failure is never retried).
    threading.Event().wait(0.1)  # the server's close reaches us
    assert http.get(server.url + "/b").status_code == 200
    assert server.connections == 2
    server.close()


def test_streams_both_ways_and_reuses_after_a_chunked_answer(http: httpx.Client) -> None:
    def chunked(request: bytes) -> bytes:
        body = request.partition(b"\r\n\r\n")[2]
        return b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n%x\r\n%b\r\n0\r\n\r\n" % (
            len(body),
            body,
        )

    server = RawServer(chunked)

    def parts() -> Iterator[bytes]:
        yield b"abc"
        yield b"def"

    with http.stream("POST", server.url + "/up", content=parts()) as r:
        echoed = b"".join(r.iter_bytes())
    # The request body went chunked (no length known), and came back whole.
    assert echoed == b"3\r\nabc\r\n3\r\ndef\r\n0\r\n\r\n"
    assert http.get(server.url + "/again").status_code == 200
    assert server.connections == 1
    server.close()


def test_an_answer_left_unread_closes_its_connection(http: httpx.Client) -> None:
    server = RawServer(ok(b"x" * 200_000))
    with http.stream("GET", server.url + "/big") as r:
        assert next(r.iter_raw()) != b""
    assert http.get(server.url + "/big").content == b"x" * 200_000
    assert server.connections == 2
    server.close()


def test_failures_are_httpx_transport_errors() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    listener.close()
    with (
        httpx.Client(transport=StdlibTransport(), timeout=5) as client,
        pytest.raises(httpx.ConnectError),
    ):
        client.get(f"http://127.0.0.1:{port}/")

    silent = socket.create_server(("127.0.0.1", 0))  # accepts (backlog), never answers
    with (
        httpx.Client(transport=StdlibTransport(), timeout=0.2) as client,
        pytest.raises(httpx.ReadTimeout),
    ):
        client.get(f"http://127.0.0.1:{silent.getsockname()[1]}/")
    silent.close()

    hangs_up = RawServer(lambda _: b"", close_after=1)
    with (
        httpx.Client(transport=StdlibTransport(), timeout=5) as client,
        pytest.raises(httpx.RemoteProtocolError),
    ):
        client.get(hangs_up.url + "/")
    hangs_up.close()


def test_the_sync_client_sends_through_it_by_default() -> None:
    from podbay import SandboxClient

    client = SandboxClient(identity_token="t", server_url="http://127.0.0.1:1")
    assert isinstance(client._transport, StdlibTransport)
    client.close()
