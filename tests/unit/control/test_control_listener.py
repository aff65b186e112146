"""The listener's gathered answers (:data:`podbay.asgi.RESPONSE_GATHER`)."""

from __future__ import annotations

import asyncio
import gc
import socket
import threading
import weakref
from collections.abc import Iterator
from typing import Any

import pytest
import uvicorn

from podbay.asgi import RESPONSE_GATHER, Receive, Scope, Send
from podbay.control.listener import _gathered, guarded_protocol


class _Transport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def get_extra_info(self, name: str) -> str:
        return f"info {name}"


class _Cycle:
    def __init__(self) -> None:
        self.transport: Any = _Transport()


def test_writes_while_gathered_leave_as_one() -> None:
    cycle = _Cycle()
    real = cycle.transport
    with _gathered(weakref.ref(cycle)):
        cycle.transport.write(b"HTTP/1.1 200 OK\r\n\r\n")
        cycle.transport.write(b"{}")
        assert cycle.transport.get_extra_info("peername") == "info peername"
        assert real.writes == []
    assert cycle.transport is real
    assert real.writes == [b"HTTP/1.1 200 OK\r\n\r\n{}"]

    # A close while gathered writes what was kept first.
    cycle = _Cycle()
    real = cycle.transport
    with _gathered(weakref.ref(cycle)):
        cycle.transport.write(b"last")
        cycle.transport.close()
    assert real.writes == [b"last"]
    assert real.closed


class _Marker:
    """Put in a request's scope: alive as long as the scope is."""


@pytest.fixture
def server() -> Iterator[tuple[int, list[bool], list[weakref.ref[_Marker]]]]:
    offered: list[bool] = []
    scopes: list[weakref.ref[_Marker]] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        marker = scope["marker"] = _Marker()
        scopes.append(weakref.ref(marker))
        gather = (scope.get("extensions") or {}).get(RESPONSE_GATHER)
        offered.append(gather is not None)
        with gather():
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [(b"content-length", b"3")],
                }
            )
            await send({"type": "http.response.body", "body": b"ok", "more_body": True})
            await send({"type": "http.response.body", "body": b"!"})

    listener = socket.create_server(("127.0.0.1", 0))
    protocol = guarded_protocol(head_timeout=5, body_timeout=5, max_connections=10)
    config = uvicorn.Config(app, http=protocol, log_level="warning", lifespan="off")
    srv = uvicorn.Server(config)
    thread = threading.Thread(target=lambda: asyncio.run(srv.serve(sockets=[listener])))
    thread.start()
    while not srv.started:
        threading.Event().wait(0.01)
    yield listener.getsockname()[1], offered, scopes
    srv.should_exit = True
    thread.join(10)


def _get(sock: socket.socket) -> None:
    sock.sendall(b"GET / HTTP/1.1\r\nhost: x\r\n\r\n")
    data = b""
    while not data.endswith(b"ok!"):
        chunk = sock.recv(65536)
        assert chunk
        data += chunk
    assert data.startswith(b"HTTP/1.1 200 OK\r\n")


def test_the_listener_offers_it_and_the_answer_arrives_whole(
    server: tuple[int, list[bool], list[weakref.ref[_Marker]]],
) -> None:
    port, offered, _ = server
    with socket.create_connection(("127.0.0.1", port)) as sock:
        for _ in range(2):  # kept alive after a gathered answer
            _get(sock)
    assert offered == [True, True]


def test_a_request_is_freed_without_the_garbage_collector(
    server: tuple[int, list[bool], list[weakref.ref[_Marker]]],
) -> None:
    """The extensions the listener puts in a scope hold its request cycle weakly:
    held strongly, scope and cycle made a reference cycle per request, which only
    the garbage collector freed (twice its collections per exec)."""
    port, _, scopes = server
    gc.collect()
    gc.disable()
    try:
        with socket.create_connection(("127.0.0.1", port)) as sock:
            _get(sock)
            # The next request's cycle replaces the first in the protocol, which
            # drops the last reference to it (and its scope) but a cycle's.
            _get(sock)
            assert scopes[0]() is None
    finally:
        gc.enable()
