"""A sandbox's agent under held requests and a silent agent, through a real server.

Seen before: 300 half-sent exec bodies (head and part of the body, held
open) made every other call to that sandbox answer 502 while they were
held; an agent stopped by guest root made every call hang until the client
gave up, and attach still said running.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from podbay.testing.platform import PlatformServer

pytestmark = [pytest.mark.root, pytest.mark.timeout(600)]

HELD = 300
CLASSES = ("container", "gvisor")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PlatformServer]:
    with PlatformServer.start(
        tmp_path_factory.mktemp("serve"),
        env={
            # Small slots, so that the streamed bodies below fill them.
            "PODBAY_SERVER_SANDBOX_REQUESTS": "8",
            "PODBAY_SERVER_SANDBOX_QUEUE": "4",
            "PODBAY_SERVER_AGENT_ANSWER_SECONDS": "3",
            "PODBAY_RUNTIME_CLASSES": ",".join(CLASSES),
        },
    ) as s:
        yield s


@pytest.fixture(scope="module")
def token(server: PlatformServer) -> str:
    return server.create_deployment("agent-slots")


def _handle(
    server: PlatformServer, token: str, name: str, klass: str = "container"
) -> dict[str, Any]:
    for _ in range(600):  # 503 while the server checks the class at start
        r = server.attach(token, name, json={"class": klass})
        if r.status_code != 503:
            break
        time.sleep(1)
    assert r.status_code == 200, r.text
    return dict(r.json())


def _half_sent(
    server: PlatformServer, handle: dict[str, Any], head: str, length: int
) -> socket.socket:
    """A connection that sent ``head``, a body of ``length`` bytes declared and 10 sent."""
    prefix = handle["endpoint"].removeprefix(server.base_url)
    headers = "".join(f"{k}: {v}\r\n" for k, v in handle["headers"].items())
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=60)
    sock.sendall(
        f"{head.replace(' /', ' ' + prefix + '/', 1)} HTTP/1.1\r\nHost: x\r\n{headers}"
        f"Content-Type: application/json\r\nContent-Length: {length}\r\n\r\n"
        '{"command"'.encode()
    )
    return sock


def _server_sockets(server: PlatformServer) -> int:
    return sum(
        1
        for fd in Path(f"/proc/{server.pid()}/fd").iterdir()
        if os.readlink(fd).startswith("socket:")
    )


def _wait_until_held(server: PlatformServer, before: int) -> None:
    """Until the server holds the connections opened (it accepted them)."""
    while _server_sockets(server) < before + HELD:
        with contextlib.suppress(OSError):
            server.http.get("/healthz")  # an event-loop turn: the accepts come first


@dataclass
class Hold:
    socks: list[socket.socket]
    #: Seconds the trickle has gone on.
    rounds: int = 0


@contextlib.contextmanager
def _holding(
    server: PlatformServer, handle: dict[str, Any], head: str, length: int
) -> Iterator[Hold]:
    """HELD half-sent requests, each sent a byte more every second (slowloris:
    never idle long enough to be dropped), until the block ends."""
    before = _server_sockets(server)
    held = [_half_sent(server, handle, head, length) for _ in range(HELD)]
    hold = Hold(held)
    stop = threading.Event()

    def trickle() -> None:
        while not stop.wait(1.0):
            for sock in held:
                with contextlib.suppress(OSError):
                    sock.send(b" ")
            hold.rounds += 1

    trickler = threading.Thread(target=trickle, daemon=True)
    trickler.start()
    try:
        _wait_until_held(server, before)
        yield hold
    finally:
        stop.set()
        trickler.join()
        for sock in held:
            sock.close()


@pytest.mark.parametrize("klass", CLASSES)
def test_held_exec_bodies_leave_the_sandbox_answering(
    server: PlatformServer, token: str, klass: str
) -> None:
    busy = _handle(server, token, f"held-execs-{klass}", klass)
    other = _handle(server, token, f"bystander-{klass}", klass)
    with _holding(server, busy, "POST /v1/exec", 1000) as hold:
        # Throughout the hold: the agent of the old relay took a few seconds to
        # run out of threads for them (then 502 for every call).
        while hold.rounds < 5:
            for handle in (busy, other):
                r = server.exec(handle, "echo", "still here")
                assert r.status_code == 200, r.text
                assert r.json()["stdout"] == "still here\n"


def _answer(sock: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


def test_held_uploads_take_half_the_slots_and_the_rest_are_refused_429(
    server: PlatformServer, token: str
) -> None:
    busy, other = _handle(server, token, "held-uploads"), _handle(server, token, "bystander")
    with _holding(server, busy, "PUT /v1/files?path=up", 1_000_000) as hold:
        # 4 hold the streaming half of the 8 slots, 4 wait: every other is refused.
        refused = []
        for sock in hold.socks[8:]:
            answer = _answer(sock)
            assert answer.startswith(b"HTTP/1.1 429 "), answer[:300]
            refused.append(answer)
        assert b"SANDBOX_BUSY" in refused[0]
        assert b"retry-after: 5" in refused[0].lower()
        for handle in (busy, other):
            r = server.exec(handle, "echo", "still here")
            assert r.status_code == 200, r.text
            assert r.json()["stdout"] == "still here\n"
    assert "Traceback" not in server.log_path.read_text()


def _agent_pid(server: PlatformServer, handle: dict[str, Any]) -> int:
    """The host pid of the sandbox's agent: the first ancestor of a process
    started in the sandbox that is its pid namespace's pid 1."""
    marker = f"{uuid.uuid4().int % 10**6}.5"
    r = server.data(handle, "POST", "/v1/processes", json={"command": ["sleep", marker]})
    assert r.status_code == 200, r.text
    wanted = f"sleep\0{marker}\0".encode()
    pid = next(
        int(p.name)
        for p in Path("/proc").iterdir()
        if p.name.isdigit() and _read(p / "cmdline") == wanted
    )
    while True:
        status = dict(
            line.split(":\t", 1)
            for line in _read(Path(f"/proc/{pid}/status")).decode().splitlines()
        )
        if status["NSpid"].split()[-1] == "1":
            return pid
        pid = int(status["PPid"])
        assert pid > 1, "no pid 1 of a namespace above the process"


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""


def test_a_stopped_agent_answers_504_and_the_next_attach_restarts_it(
    server: PlatformServer, token: str
) -> None:
    handle = _handle(server, token, "stopped-agent")
    pid = _agent_pid(server, handle)
    os.kill(pid, signal.SIGSTOP)
    try:
        r = server.exec(handle, "true", timeout_ms=1000)
        assert r.status_code == 504, r.text
        assert r.json()["code"] == "AGENT_TIMEOUT"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
    # The machine's check began before the 504 and stops it (its agent stays
    # silent): the attach that follows waits for it and starts the sandbox again.
    again = server.attach(token, "stopped-agent")
    assert again.status_code == 200, again.text
    assert again.json()["start"] == "carried_over", again.text
    r = server.exec(again.json(), "echo", "back")
    assert r.status_code == 200, r.text
    assert r.json()["stdout"] == "back\n", r.text


def test_a_stopped_agent_answers_504_to_other_calls_after_the_bound(
    server: PlatformServer, token: str
) -> None:
    handle = _handle(server, token, "stopped-agent-info")
    pid = _agent_pid(server, handle)
    os.kill(pid, signal.SIGSTOP)
    try:
        r = server.data(handle, "GET", "/v1/files/stat", params={"path": "/workspace"})
        assert r.status_code == 504, r.text
        assert json.loads(r.text)["code"] == "AGENT_TIMEOUT"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
    again = server.attach(token, "stopped-agent-info")
    assert again.status_code == 200, again.text
    assert again.json()["start"] == "carried_over", again.text
