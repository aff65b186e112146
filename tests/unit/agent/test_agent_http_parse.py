from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from podbay.agent.http import (
    MAX_HEAD_BYTES,
    ProtocolError,
    Request,
    Response,
    Server,
    _Connection,
    parse_request,
    write_response,
)

_opened: list[socket.socket] = []


@pytest.fixture(autouse=True)
def _close_connections() -> Iterator[None]:
    yield
    while _opened:
        _opened.pop().close()


def _conn(data: bytes) -> _Connection:
    """A connection that reads ``data``, closed after the test."""
    a, b = socket.socketpair()
    _opened.append(b)

    def feed() -> None:
        with a:
            a.sendall(data)

    threading.Thread(target=feed, daemon=True).start()
    return _Connection(b)


def test_parses_head_query_and_content_length_body() -> None:
    conn = _conn(
        b"POST /v1/x?path=a%20b&n=1 HTTP/1.1\r\nHost: h\r\nX-A: 1\r\nX-A: 2\r\n"
        b"Content-Length: 5\r\n\r\nhello"
    )
    req = parse_request(conn, lambda: None)
    assert req is not None
    assert (req.method, req.path, req.query) == ("POST", "/v1/x", {"path": "a b", "n": "1"})
    assert req.headers["x-a"] == "1, 2"
    assert req.keep_alive
    assert req.body.read_all(100) == b"hello"
    assert req.body.finished
    assert parse_request(conn, lambda: None) is None  # clean end of stream


def test_chunked_body_with_extensions_and_trailers() -> None:
    conn = _conn(
        b"PUT / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"3;ext=1\r\nabc\r\n2\r\nde\r\n0\r\nTrailer: x\r\n\r\n"
    )
    req = parse_request(conn, lambda: None)
    assert req is not None
    assert req.body.read_all(100) == b"abcde"


def test_body_over_the_limit() -> None:
    conn = _conn(b"POST / HTTP/1.1\r\nContent-Length: 10\r\n\r\n0123456789")
    req = parse_request(conn, lambda: None)
    assert req is not None
    with pytest.raises(ProtocolError):
        req.body.read_all(5)


def test_head_too_large() -> None:
    conn = _conn(b"GET / HTTP/1.1\r\nX: " + b"a" * MAX_HEAD_BYTES + b"\r\n\r\n")
    with pytest.raises(ProtocolError) as info:
        parse_request(conn, lambda: None)
    assert info.value.status == 431


def test_streamed_response_with_and_without_length() -> None:
    a, b = socket.socketpair()
    assert write_response(a, Response(200, iter([b"ab", b"c"]), length=3), True)
    assert not write_response(a, Response(200, iter([b"ab", b"", b"c"])), False)
    a.close()
    with b:
        raw = b"".join(iter(lambda: b.recv(65536), b""))
    assert b"Content-Length: 3\r\n\r\nabc" in raw
    assert b"Transfer-Encoding: chunked\r\n" in raw
    assert raw.endswith(b"2\r\nab\r\n1\r\nc\r\n0\r\n\r\n")
    assert b"Connection: close" in raw


def test_a_connection_thread_serves_the_next_connection() -> None:
    """Threads are kept for later connections (a thread start is costly under
    gVisor), while connections open together still get threads of their own."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind("\0podbay-test-http-" + str(threading.get_ident()))
    listener.listen()
    served: list[threading.Thread] = []
    release = threading.Event()

    def handler(req: Request) -> Response:
        served.append(threading.current_thread())
        if req.path == "/hold":
            release.wait(10)
        return Response(200, b"{}")

    server = Server(listener, handler, lambda status, message: Response(status))
    threading.Thread(target=server.serve_forever, daemon=True).start()

    def call(path: str) -> bytes:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as c:
            c.connect(listener.getsockname())
            c.sendall(f"GET {path} HTTP/1.1\r\nConnection: close\r\n\r\n".encode())
            return b"".join(iter(lambda: c.recv(4096), b""))

    def kept_idle() -> None:  # the thread parks a moment after the answer is out
        deadline = time.monotonic() + 10
        while getattr(server, "_idle", 1) == 0 and time.monotonic() < deadline:
            time.sleep(0.005)

    for _ in range(3):
        assert call("/x").startswith(b"HTTP/1.1 200")
        kept_idle()
    assert served[0] is served[1] is served[2]
    held = threading.Thread(target=call, args=("/hold",))
    held.start()
    while len(served) < 4:
        time.sleep(0.01)
    assert call("/x").startswith(b"HTTP/1.1 200")  # while the kept thread is busy
    release.set()
    held.join()
    assert served[4] is not served[3]
