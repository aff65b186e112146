"""An idle agent hibernates (a bare waiter keeps its socket) and wakes on the next
connection; nothing in use lets it sleep."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from agent_harness import Agent, start_agent

from podbay.agent.hibernate import ENV, WAITER

#: Idle seconds before hibernating, in these tests.
DELAY = 0.5
RELAYED = {"X-Request-Id": "from-the-gateway"}


@pytest.fixture
def sleepy(tmp_path: Path, staged: Path) -> Iterator[Agent]:
    running = start_agent(tmp_path, staged, env={ENV: str(DELAY)})
    yield running
    running.stop()


def hibernating(agent: Agent) -> bool:
    return WAITER in Path(f"/proc/{agent.pid}/cmdline").read_bytes().decode()


def private_kib(agent: Agent) -> int:
    for line in Path(f"/proc/{agent.pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Private_Dirty:"):
            return int(line.split()[1])
    raise AssertionError("no Private_Dirty")


def wait_hibernating(agent: Agent, within: float = 15.0) -> None:
    deadline = time.monotonic() + within
    while not hibernating(agent):
        assert time.monotonic() < deadline, "the idle agent did not hibernate"
        time.sleep(0.05)


def stays_awake(agent: Agent, seconds: float = 4 * DELAY + 1) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if hibernating(agent):
            return False
        time.sleep(0.05)
    return True


def test_hibernates_when_idle_and_wakes_on_the_next_request(sleepy: Agent) -> None:
    awake_kib = private_kib(sleepy)
    pid = sleepy.pid
    assert sleepy.client.post("/v1/exec", json={"command": ["true"]}, headers=RELAYED).is_success
    wait_hibernating(sleepy)
    assert sleepy.pid == pid  # the same process, now the waiter
    assert private_kib(sleepy) < awake_kib / 2
    # The client's kept connection was closed; a new request wakes the agent.
    with sleepy.new_client() as client:
        answer = client.post("/v1/exec", json={"command": ["echo", "awake"]})
    assert answer.status_code == 200
    assert answer.json()["stdout"] == "awake\n"
    assert not hibernating(sleepy)
    # Woken, it is armed again only by a relayed request.
    assert stays_awake(sleepy)


def test_not_armed_by_the_runtimes_own_calls(sleepy: Agent) -> None:
    """Readiness checks and the warm pool's warm-up carry no request id: a pooled
    sandbox stays awake, so its new owner's first exec is fast."""
    assert sleepy.exec(["true"]).is_success
    assert stays_awake(sleepy)


def test_a_process_keeps_it_awake(sleepy: Agent) -> None:
    spawned = sleepy.client.post(
        "/v1/processes", json={"command": ["sleep", "30"]}, headers=RELAYED
    ).json()
    assert stays_awake(sleepy)
    sleepy.client.delete(f"/v1/processes/{spawned['process_id']}")
    wait_hibernating(sleepy)


def test_a_request_under_way_keeps_it_awake(sleepy: Agent) -> None:
    answer = sleepy.client.post(
        "/v1/exec", json={"command": ["sleep", str(4 * DELAY)]}, headers=RELAYED
    )
    assert answer.status_code == 200
    assert answer.json()["exit_code"] == 0
    wait_hibernating(sleepy)


def test_an_idle_kept_connection_is_shut_not_dropped_mid_request(sleepy: Agent) -> None:
    """A write on a connection the hibernating agent shut fails at once (EPIPE),
    so a client knows nothing was delivered and can send it again."""
    kept = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    kept.connect(sleepy.sock_path)
    kept.sendall(b"GET /v1/info HTTP/1.1\r\nHost: a\r\nX-Request-Id: r\r\n\r\n")
    assert kept.recv(65536).startswith(b"HTTP/1.1 200 ")
    wait_hibernating(sleepy)

    def write_until_refused() -> None:
        for _ in range(3):
            kept.sendall(b"GET /v1/info HTTP/1.1\r\nHost: a\r\n\r\n")
            time.sleep(0.05)

    with pytest.raises(BrokenPipeError):
        write_until_refused()
    kept.close()
    with sleepy.new_client() as client:
        assert client.get("/v1/info").status_code == 200


def test_off_without_the_setting(agent: Agent) -> None:
    assert agent.client.get("/v1/info", headers=RELAYED).is_success
    assert stays_awake(agent)
