"""What a request leaves behind when it is cut, and odd file reads, in every class
through a real server: an exec whose client goes away, or that a SIGTERM of the
server cuts, is killed with everything it started (its command never finishes
and its files never appear); a read of a file that is no file is 400.

Before, under ``gvisor`` (its agent's host-backed socket reports no hang-up)
and ``vm`` (the relay passed a client's close on as a half-close) the command
ran to its end. ``PODBAY_TEST_CUT_CLASSES`` (default ``container,gvisor,vm``)
lists the classes to run over."""

from __future__ import annotations

import http.client
import json
import os
import time
import uuid
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import pytest

from podbay.testing.platform import PlatformServer

pytestmark = [pytest.mark.root, pytest.mark.timeout(1500)]

CLASSES = os.environ.get("PODBAY_TEST_CUT_CLASSES", "container,gvisor,vm").split(",")
ENV = {
    "PODBAY_RUNTIME_CLASSES": ",".join(CLASSES),
    "PODBAY_RUNTIME_MEMORY_BYTES": str(512 << 20),  # a vm guest's, under TCG
}


def wait_for_classes(server: PlatformServer, timeout: float = 900) -> None:
    """Until every class of the module is proven (vm boots under TCG)."""
    deadline = time.monotonic() + timeout
    while not set(CLASSES) <= set(server.http.get("/healthz").json()["classes"]["available"]):
        assert time.monotonic() < deadline, server.http.get("/healthz").text
        time.sleep(0.5)


def attach(server: PlatformServer, token: str, name: str, cls: str) -> dict[str, Any]:
    r = server.attach(token, name, json={"class": cls})
    assert r.status_code == 200, r.text
    return dict(r.json())


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PlatformServer]:
    with PlatformServer.start(tmp_path_factory.mktemp("serve-cut"), env=ENV) as s:
        wait_for_classes(s)
        yield s


@pytest.fixture(scope="module")
def token(server: PlatformServer) -> str:
    return server.create_deployment("cut")


@pytest.fixture(scope="module", params=CLASSES)
def handle(
    request: pytest.FixtureRequest, server: PlatformServer, token: str
) -> Iterator[dict[str, Any]]:
    name = f"cut-{request.param}"
    yield attach(server, token, name, request.param)
    server.api("DELETE", f"/api/v1/sandboxes/{name}", token)


def send_exec(handle: dict[str, Any], command: list[str]) -> http.client.HTTPConnection:
    """Send an exec and leave its answer unread: the caller drops the connection."""
    url = urlsplit(handle["endpoint"])
    conn = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port, timeout=60)
    body = json.dumps({"command": command, "timeout_ms": 120_000})
    headers = {**handle["headers"], "Content-Type": "application/json"}
    conn.request("POST", url.path + "/v1/exec", body=body, headers=headers)
    return conn


def running(server: PlatformServer, handle: dict[str, Any], marker: str) -> bool:
    """Whether a process whose command line holds ``marker`` runs in the sandbox."""
    listing = server.exec(handle, "ps", "-e", "-o", "args=")
    assert listing.status_code == 200, listing.text
    return any(
        marker in line and "ps -e" not in line for line in listing.json()["stdout"].split("\n")
    )


def wait_running(
    server: PlatformServer, handle: dict[str, Any], marker: str, want: bool, timeout: float
) -> None:
    """Until ``marker``'s process runs (``want``) or is gone, polling the process list."""
    deadline = time.monotonic() + timeout
    while running(server, handle, marker) != want:
        assert time.monotonic() < deadline, f"{marker}: {'never started' if want else 'still runs'}"
        time.sleep(0.2)


def late_command(seconds: int) -> tuple[str, list[str]]:
    """A command that writes its marker file after ``seconds``, and that marker."""
    marker = f"/workspace/late-{uuid.uuid4().hex[:8]}"
    return marker, ["sh", "-c", f"sleep {seconds}; touch {marker}"]


def test_an_exec_whose_client_goes_away_is_killed(
    server: PlatformServer, handle: dict[str, Any]
) -> None:
    marker, command = late_command(3)
    started = time.monotonic()
    conn = send_exec(handle, command)
    wait_running(server, handle, marker, True, 60)
    conn.close()
    wait_running(server, handle, marker, False, 30)
    # Past the moment it would have written its file (3 s after it started).
    time.sleep(max(0.0, started + 4 - time.monotonic()))
    probe = server.exec(handle, "sh", "-c", f"test -e {marker}; echo $?")
    assert probe.json()["stdout"] == "1\n", "the cut exec's command ran to its end"


def test_special_file_reads_are_invalid_paths(
    server: PlatformServer, handle: dict[str, Any]
) -> None:
    made = server.exec(
        handle,
        "python3",
        "-c",
        "import socket; socket.socket(socket.AF_UNIX).bind('/workspace/a.sock')",
    )
    assert made.json()["exit_code"] == 0, made.text
    for path in ("/dev/tty", "/proc/self/fd/3", "/proc/self/mem", "/workspace/a.sock"):
        r = server.data(handle, "GET", "/v1/files", params={"path": path})
        # 409 PATH_ACCESS_DENIED where the kernel refuses the agent its own
        # memory (runc: it is not dumpable); never a 500.
        assert (r.status_code, r.json()["code"]) in {
            (400, "PATH_INVALID"),
            (409, "PATH_ACCESS_DENIED"),
        }, (path, r.text)
    for path in ("/dev/tty", "/workspace/a.sock"):
        r = server.data(handle, "GET", "/v1/files", params={"path": path})
        assert (r.status_code, r.json()["code"]) == (400, "PATH_INVALID"), (path, r.text)


def test_execs_cut_by_a_sigterm_are_killed(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    with PlatformServer.start(tmp_path_factory.mktemp("serve-cut-term"), env=ENV) as server:
        wait_for_classes(server)
        token = server.create_deployment("cut-term")
        handles = {cls: attach(server, token, f"term-{cls}", cls) for cls in CLASSES}
        # Longer than the server's graceful shutdown (5 s): the SIGTERM cuts it.
        cut = {cls: late_command(15) for cls in CLASSES}
        started = time.monotonic()
        conns = [send_exec(handles[cls], cut[cls][1]) for cls in CLASSES]
        for cls in CLASSES:
            wait_running(server, handles[cls], cut[cls][0], True, 60)
        server.terminate(timeout=60)
        for conn in conns:
            conn.close()
        server.spawn()
        server.wait_ready()
        wait_for_classes(server)
        for cls in CLASSES:
            handle = attach(server, token, f"term-{cls}", cls)
            wait_running(server, handle, cut[cls][0], False, 60)
        time.sleep(max(0.0, started + 16 - time.monotonic()))
        for cls in CLASSES:
            handle, marker = attach(server, token, f"term-{cls}", cls), cut[cls][0]
            probe = server.exec(handle, "sh", "-c", f"test -e {marker}; echo $?")
            assert probe.json()["stdout"] == "1\n", f"{cls}: the cut exec ran to its end"
