"""The kernel-side body relay (gateway/splice.py) between real sockets."""

from __future__ import annotations

import asyncio
import os
import socket
import threading
from collections.abc import Iterator

import pytest

from podbay.gateway.splice import Outcome, splice_body, splice_in_thread

MIB = 1024 * 1024


@pytest.fixture
def client() -> Iterator[tuple[socket.socket, socket.socket]]:
    """(the client's end, the gateway's end) of a TCP connection."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        far = socket.create_connection(listener.getsockname())
        near, _ = listener.accept()
    near.setblocking(False)
    yield far, near
    far.close()
    near.close()


@pytest.fixture
def agent() -> Iterator[tuple[socket.socket, socket.socket]]:
    """(the gateway's end, the agent's end) of a unix socket."""
    near, far = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    near.setblocking(False)
    yield near, far
    near.close()
    far.close()


@pytest.fixture
def stop() -> Iterator[tuple[int, int]]:
    r, w = os.pipe()
    yield r, w
    os.close(r)
    os.close(w)


def _send(sock: socket.socket, data: bytes) -> threading.Thread:
    sender = threading.Thread(target=sock.sendall, args=(data,))
    sender.start()
    return sender


def _receive(sock: socket.socket, into: list[bytes]) -> threading.Thread:
    def run() -> None:
        while chunk := sock.recv(MIB):
            into.append(chunk)

    reader = threading.Thread(target=run)
    reader.start()
    return reader


def test_moves_exactly_the_body_and_leaves_what_follows(client, agent, stop) -> None:  # type: ignore[no-untyped-def]
    body = os.urandom(8 * MIB + 123)
    sender = _send(client[0], body + b"NEXT")
    got: list[bytes] = []
    reader = _receive(agent[1], got)
    outcome = splice_body(
        client[1].fileno(), agent[0].fileno(), len(body), 10, stop[0], head=b"already read"
    )
    agent[0].shutdown(socket.SHUT_WR)
    reader.join()
    sender.join()
    assert outcome is Outcome.DONE
    assert b"".join(got) == b"already read" + body
    client[1].setblocking(True)
    assert client[1].recv(16) == b"NEXT"


def test_a_client_that_closes_early_is_gone(client, agent, stop) -> None:  # type: ignore[no-untyped-def]
    client[0].sendall(b"x" * 1000)
    client[0].close()
    outcome = splice_body(client[1].fileno(), agent[0].fileno(), 5000, 10, stop[0])
    assert outcome is Outcome.CLIENT_GONE


def test_an_idle_client_is_gone_after_the_timeout(client, agent, stop) -> None:  # type: ignore[no-untyped-def]
    client[0].sendall(b"x" * 1000)
    outcome = splice_body(client[1].fileno(), agent[0].fileno(), 5000, 0.2, stop[0])
    assert outcome is Outcome.CLIENT_GONE


def test_an_agent_that_stops_reading_gets_the_rest_dropped(client, agent, stop) -> None:  # type: ignore[no-untyped-def]
    """The rest of the body is read off the client's socket (and dropped), so the
    client can finish sending and read the agent's answer."""
    agent[1].close()
    body = b"y" * (4 * MIB)
    sender = _send(client[0], body + b"NEXT")
    outcome = splice_body(client[1].fileno(), agent[0].fileno(), len(body), 10, stop[0])
    sender.join()
    assert outcome is Outcome.AGENT_GONE
    client[1].setblocking(True)
    assert client[1].recv(16) == b"NEXT"


def test_cancelling_stops_the_thread(client, agent) -> None:  # type: ignore[no-untyped-def]
    """The relay cancelled (the server stopping): the thread is told to stop and
    is waited for, not left polling sockets that are about to be closed."""

    def splicing() -> bool:
        return any(t.name == "podbay-splice" for t in threading.enumerate())

    async def run() -> None:
        task = asyncio.ensure_future(
            splice_in_thread(client[1].fileno(), agent[0].fileno(), MIB, 30)
        )
        await asyncio.sleep(0.1)
        assert splicing()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        for _ in range(100):  # the thread's last instructions after handing back
            if not splicing():
                break
            await asyncio.sleep(0.01)
        assert not splicing()

    asyncio.run(run())


def test_an_agent_gone_before_the_body_gets_none_of_it(client, stop) -> None:  # type: ignore[no-untyped-def]
    body = b"z" * MIB
    sender = _send(client[0], body + b"NEXT")
    outcome = splice_body(client[1].fileno(), -1, len(body), 10, stop[0])
    sender.join()
    assert outcome is Outcome.AGENT_GONE
    client[1].setblocking(True)
    assert client[1].recv(16) == b"NEXT"
