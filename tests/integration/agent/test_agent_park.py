"""The agent's park for a checkpoint (``POST /v1/park``, podbay.agent.park), on a
real agent serving a socket it bound itself (as under gVisor), in a network
namespace of its own (its TCP counters are then its own: none)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from agent_harness import DECLARED

from podbay.agent import park
from podbay.runtime.staging import AGENT_ENV, agent_argv
from podbay.wire import paths

pytestmark = pytest.mark.root


def raw(sock_path: str, head: str) -> bytes:
    """Send one request on a new connection; everything until the agent closes it."""
    with socket.socket(socket.AF_UNIX) as conn:
        conn.settimeout(30)
        conn.connect(sock_path)
        conn.sendall(head.encode())
        answer = b""
        try:
            while chunk := conn.recv(4096):
                answer += chunk
        except ConnectionResetError:
            pass
        return answer


@pytest.fixture
def own_socket_agent(tmp_path: Path, staged: Path) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    (tmp_path / "workspace").mkdir()
    (tmp_path / "env.json").write_text(json.dumps(DECLARED))
    sock_path = str(run / "agent.sock")
    argv = agent_argv(
        [sys.executable],
        staged,
        "--socket",
        sock_path,
        "--workspace",
        str(tmp_path / "workspace"),
        "--env-file",
        str(tmp_path / "env.json"),
    )
    proc = subprocess.Popen(
        ["unshare", "--net", "--", *argv], env={**os.environ, **AGENT_ENV}, cwd=str(tmp_path)
    )
    try:
        deadline = time.monotonic() + 30
        while not Path(sock_path).is_socket():
            assert time.monotonic() < deadline, "the agent did not bind"
            time.sleep(0.02)
        yield proc, sock_path
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture
def clients() -> Iterator[list[httpx.Client]]:
    made: list[httpx.Client] = []
    yield made
    for client in made:
        client.close()


def test_a_park_closes_every_socket_and_a_marker_binds_it_again(
    own_socket_agent: tuple[subprocess.Popen[bytes], str], clients: list[httpx.Client]
) -> None:
    _, sock_path = own_socket_agent
    client = httpx.Client(transport=httpx.HTTPTransport(uds=sock_path), base_url="http://a")
    clients.append(client)
    spawned = client.post("/v1/processes", json={"command": ["sleep", "600"]}).json()
    # A relayed request (the gateway adds X-Request-Id) is refused: a client
    # cannot leave its sandbox's agent parked.
    relayed = client.post(paths.PARK, headers={paths.REQUEST_ID_HEADER: "r1"})
    assert relayed.status_code == 404
    assert client.get(paths.INFO).status_code == 200  # served on, kept connection too
    kept = socket.socket(socket.AF_UNIX)
    kept.settimeout(30)
    kept.connect(sock_path)
    kept.sendall(b"GET /v1/info HTTP/1.1\r\nHost: a\r\n\r\n")  # accepted: its thread holds it
    assert kept.recv(4096).startswith(b"HTTP/1.1 200")
    answer = raw(sock_path, f"POST {paths.PARK} HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n")
    assert answer == b"" or b" 202 " in answer.split(b"\r\n", 1)[0]
    assert kept.recv(1) == b""  # the other connections are shut too
    parked = Path(sock_path).with_name(park.PARKED)  # said once every socket is closed
    deadline = time.monotonic() + 30
    while not parked.exists():
        assert time.monotonic() < deadline, "the agent did not say it parked"
        time.sleep(0.01)
    kept.close()
    with pytest.raises(ConnectionRefusedError):  # no listener: nothing to save
        raw(sock_path, "GET /v1/info HTTP/1.1\r\nHost: a\r\n\r\n")
    Path(park.resumed_marker(sock_path)).touch()
    deadline = time.monotonic() + 30
    while True:
        try:
            raw(sock_path, "GET /v1/info HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n")
            break
        except (ConnectionRefusedError, FileNotFoundError):
            assert time.monotonic() < deadline, "the agent did not bind again"
            time.sleep(0.02)
    fresh = httpx.Client(transport=httpx.HTTPTransport(uds=sock_path), base_url="http://a")
    clients.append(fresh)
    listed = fresh.get("/v1/processes").json()["processes"]
    assert [p["state"] for p in listed if p["process_id"] == spawned["process_id"]] == ["running"]


def test_a_park_is_refused_while_a_tcp_connection_is_open(
    own_socket_agent: tuple[subprocess.Popen[bytes], str], clients: list[httpx.Client]
) -> None:
    proc, sock_path = own_socket_agent
    client = httpx.Client(transport=httpx.HTTPTransport(uds=sock_path), base_url="http://a")
    clients.append(client)
    script = (
        "import socket, time; s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(); "
        "c = socket.create_connection(s.getsockname()); a, _ = s.accept(); "
        "open('connected', 'w').close(); time.sleep(600)"
    )
    client.post(
        "/v1/processes",
        json={"command": ["sh", "-c", 'ip link set lo up; exec python3 -c "$0"', script]},
    )
    workspace = Path(sock_path).parent.parent / "workspace"
    deadline = time.monotonic() + 30
    while not (workspace / "connected").exists():
        assert time.monotonic() < deadline, "no connection made"
        time.sleep(0.02)
    refused = client.post(paths.PARK)
    assert refused.status_code == 429
    assert refused.json()["code"] == "SANDBOX_BUSY"
    assert "TCP connection" in refused.json()["error"]
    assert client.get(paths.INFO).status_code == 200
    assert proc.poll() is None
