"""An idle sandbox's agent hibernates and its next request, through the gateway,
wakes it; a machine waiting in the warm pool stays awake."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from podbay.agent.hibernate import WAITER
from podbay.testing.platform import PlatformServer

pytestmark = pytest.mark.root


def _agent_pid(server: PlatformServer, machine_id: str) -> int:
    state = subprocess.run(
        ["runc", "--root", f"{server.run_dir}/runc", "state", machine_id],
        capture_output=True,
        check=True,
    )
    return int(json.loads(state.stdout)["pid"])


def _machine_of(server: PlatformServer, handle: dict[str, Any]) -> str:
    sandbox_id = handle["endpoint"].rsplit("/", 1)[1]
    with sqlite3.connect(server.data_dir / "podbay.db") as db:
        (machine_id,) = db.execute(
            "SELECT machine_id FROM sandboxes WHERE id=?", (sandbox_id,)
        ).fetchone()
    return str(machine_id)


def _hibernating(pid: int) -> bool:
    return WAITER in Path(f"/proc/{pid}/cmdline").read_bytes().decode()


def test_an_idle_sandbox_hibernates_and_wakes_on_its_next_exec(make_server):
    server = make_server(
        {"PODBAY_RUNTIME_WARM_POOL": "1", "PODBAY_RUNTIME_AGENT_HIBERNATE_SECONDS": "1"}
    )
    token = server.create_deployment("sleepy")
    handle = server.attach(token, "sleeper").json()
    assert server.exec(handle, "sh", "-c", "echo kept > /workspace/f").json()["exit_code"] == 0
    pid = _agent_pid(server, _machine_of(server, handle))
    deadline = time.monotonic() + 30
    while not _hibernating(pid):
        assert time.monotonic() < deadline, "the idle sandbox's agent did not hibernate"
        time.sleep(0.1)
    # Through the gateway's kept connection (which the agent shut) or a new one:
    # either way the request wakes the agent and is answered.
    for _ in range(2):
        answer = server.exec(handle, "cat", "/workspace/f")
        assert answer.status_code == 200
        assert answer.json()["stdout"] == "kept\n"
    assert not _hibernating(pid)
    # The machine that refilled the pool has only seen the runtime's own calls.
    machines = subprocess.run(
        ["runc", "--root", f"{server.run_dir}/runc", "list", "-q"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    pooled = [m for m in machines if m != _machine_of(server, handle)]
    assert pooled, "the pool did not refill"
    time.sleep(3)
    assert not any(_hibernating(_agent_pid(server, m)) for m in pooled)
