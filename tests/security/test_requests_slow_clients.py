"""Slow clients and connection floods: a half-sent request is not held for
ever, and a saturated listener leaves the lifecycle working.

Seen before: 20,500 half-sent requests exhausted the server's descriptors,
attach failed and the lifecycle pass threw "Too many open files".
"""

from __future__ import annotations

import socket
import sqlite3
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from podbay.testing.platform import PlatformServer

pytestmark = [pytest.mark.root, pytest.mark.timeout(300)]

#: Generous for a loaded 2-core machine; the point is "closed", not "fast".
PATIENCE = 60.0


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PlatformServer]:
    with PlatformServer.start(
        tmp_path_factory.mktemp("serve"),
        env={
            "PODBAY_SERVER_HEAD_TIMEOUT_SECONDS": "2",
            "PODBAY_SERVER_BODY_TIMEOUT_SECONDS": "2",
            "PODBAY_SERVER_MAX_CONNECTIONS": "64",
            "PODBAY_LIFECYCLE_IDLE_SECONDS": "3",
            "PODBAY_LIFECYCLE_INTERVAL_SECONDS": "0.5",
        },
    ) as s:
        yield s


def closed_by_server(sock: socket.socket) -> bytes:
    """Everything the server sends until it closes (raises on PATIENCE)."""
    sock.settimeout(PATIENCE)
    answer = b""
    while data := sock.recv(65536):
        answer += data
    return answer


def test_half_sent_head_is_answered_408_and_closed(server: PlatformServer) -> None:
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        answer = closed_by_server(sock)
    assert answer.startswith(b"HTTP/1.1 408 "), answer[:200]
    assert b"REQUEST_TIMEOUT" in answer


def test_silent_connection_is_closed(server: PlatformServer) -> None:
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        closed_by_server(sock)


def test_stalled_body_is_dropped(server: PlatformServer) -> None:
    token = server.create_deployment("stalled-body")
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(
            f"PUT /api/v1/sandboxes/stalled HTTP/1.1\r\nHost: x\r\n"
            f"Authorization: Bearer {token}\r\nContent-Length: 1000\r\n\r\n{{".encode()
        )
        closed_by_server(sock)
    assert "Traceback" not in server.log_path.read_text()


def _sandbox_state(server: PlatformServer, name: str) -> str:
    db = sqlite3.connect(f"file:{server.data_dir / 'podbay.db'}?mode=ro", uri=True, timeout=30)
    try:
        row = db.execute("SELECT state FROM sandboxes WHERE name = ?", (name,)).fetchone()
    finally:
        db.close()
    return str(row[0]) if row else "absent"


def test_saturated_listener_leaves_the_lifecycle_working(server: PlatformServer) -> None:
    token = server.create_deployment("saturated")
    assert server.attach(token, "idle-one").status_code == 200
    # A small descriptor budget, so that a flood would exhaust it without the cap.
    subprocess.run(["prlimit", f"--pid={server.pid()}", "--nofile=400:400"], check=True)
    log_before = len(server.log_path.read_text())

    stop = threading.Event()
    held: list[socket.socket] = []

    def flood() -> None:
        # Keep 600 half-sent requests open, reopening whatever the server closes.
        while not stop.is_set():
            alive = []
            for sock in held:
                try:
                    sock.setblocking(False)
                    gone = sock.recv(1, socket.MSG_PEEK) == b""
                except BlockingIOError:
                    gone = False
                except OSError:
                    gone = True
                if gone:
                    sock.close()
                else:
                    alive.append(sock)
            held[:] = alive
            while len(held) < 600 and not stop.is_set():
                try:
                    sock = socket.create_connection(("127.0.0.1", server.port), timeout=5)
                except OSError:
                    break
                try:
                    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
                except OSError:
                    # A connection the server cut at once: closed here, not left
                    # to the collector (a ResourceWarning in some later test).
                    sock.close()
                    break
                held.append(sock)
            time.sleep(0.05)

    flooder = threading.Thread(target=flood, daemon=True)
    flooder.start()
    try:
        deadline = time.monotonic() + PATIENCE
        while _sandbox_state(server, "idle-one") == "running" and time.monotonic() < deadline:
            time.sleep(0.5)
        state = _sandbox_state(server, "idle-one")
        open_fds = len(list(Path(f"/proc/{server.pid()}/fd").iterdir()))
    finally:
        stop.set()
        flooder.join(30)
        for sock in held:
            sock.close()
    logged = server.log_path.read_text()[log_before:]
    assert state == "suspended", logged[-3000:]
    assert open_fds < 400
    assert "Too many open files" not in logged, logged[-3000:]
    # And once the flood is gone, attach works again (and resumes it).
    deadline = time.monotonic() + PATIENCE
    while True:
        try:
            r = server.attach(token, "idle-one")
            break
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    assert r.status_code == 200, r.text
