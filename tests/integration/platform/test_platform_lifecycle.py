"""Idle, reclaim and ceiling with second-long thresholds, on real sandboxes."""

from __future__ import annotations

import time

import pytest

pytestmark = pytest.mark.root

FAST = {
    "PODBAY_LIFECYCLE_IDLE_SECONDS": "2",
    "PODBAY_LIFECYCLE_SUSPENDED_TTL_SECONDS": "3",
    "PODBAY_LIFECYCLE_MAX_AGE_SECONDS": "5",
    "PODBAY_LIFECYCLE_INTERVAL_SECONDS": "0.25",
}


@pytest.fixture(scope="module")
def fast(tmp_path_factory):
    from podbay.testing.platform import PlatformServer

    with PlatformServer.start(tmp_path_factory.mktemp("fast"), env=FAST) as s:
        yield s


def _state(server, token, name):
    r = server.api("GET", f"/api/v1/sandboxes/{name}", token)
    return r.json()["state"] if r.status_code == 200 else r.status_code


def _wait_state(server, token, name, want, timeout=15.0, busy=None):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if busy is not None:
            busy()
        state = _state(server, token, name)
        if state == want:
            return
        time.sleep(0.2)
    raise AssertionError(f"{name} is {state}, wanted {want}")


def test_idle_suspends_then_reclaims(fast):
    token = fast.create_deployment("idle-agent")
    h = fast.attach(token, "idle").json()
    fast.exec(h, "sh", "-c", "echo kept > /workspace/f")
    spawned = fast.data(
        h, "POST", "/v1/processes", json={"command": ["sh", "-c", "echo tick; sleep 600"]}
    ).json()
    _wait_state(fast, token, "idle", "suspended")
    r = fast.exec(h, "true")
    assert (r.status_code, r.json()["code"]) == (401, "SANDBOX_NOT_RUNNING")
    resumed = fast.attach(token, "idle").json()
    assert resumed["start"] == "resumed"
    assert fast.exec(resumed, "cat", "/workspace/f").json()["stdout"] == "kept\n"
    # memory intact: the process spawned before the suspension still runs
    polled = fast.data(resumed, "GET", f"/v1/processes/{spawned['process_id']}").json()
    assert polled["state"] == "running"
    assert polled["stdout"] == "tick\n"

    _wait_state(fast, token, "idle", "suspended")
    _wait_state(fast, token, "idle", 404)  # untouched past the ttl: reclaimed
    fresh = fast.attach(token, "idle").json()
    assert fresh["start"] == "created"
    assert fast.exec(fresh, "ls", "-A", "/workspace").json()["stdout"] == ""
    fast.api("DELETE", "/api/v1/sandboxes/idle", token)


def test_ceiling_stops_then_carries_over(fast):
    token = fast.create_deployment("old-agent")
    h = fast.attach(token, "old").json()
    fast.exec(h, "sh", "-c", "echo kept > /workspace/f")
    _wait_state(fast, token, "old", "stopped", busy=lambda: fast.exec(h, "true"))
    record = fast.api("GET", "/api/v1/sandboxes/old", token).json()
    assert "ceiling_at" not in record
    r = fast.exec(h, "true")
    assert (r.status_code, r.json()["code"]) == (401, "SANDBOX_NOT_RUNNING")
    again = fast.attach(token, "old").json()
    assert again["start"] == "carried_over"
    assert again["ceiling_at"] > h["ceiling_at"]
    assert fast.exec(again, "cat", "/workspace/f").json()["stdout"] == "kept\n"
    stale = fast.exec(h, "true")  # the old incarnation's credential is dead
    assert stale.json()["code"] == "SANDBOX_NOT_RUNNING"
    fast.api("DELETE", "/api/v1/sandboxes/old", token)


def test_long_exec_is_not_suspended_under_it(fast):
    token = fast.create_deployment("slow-agent")
    h = fast.attach(token, "slow").json()
    r = fast.exec(h, "sh", "-c", "sleep 3.5; echo done")  # idle threshold is 2 s
    assert r.status_code == 200
    assert r.json()["stdout"] == "done\n"
    assert _state(fast, token, "slow") == "running"
    fast.api("DELETE", "/api/v1/sandboxes/slow", token)
