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
from podbay.runtime import probes
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


def _console(server: PlatformServer, machine_id: str) -> Path:
    """The gVisor machine's agent output (its stderr: what it says it does)."""
    found = list(Path(f"{server.run_dir}-gvisor").glob(f"**/{machine_id}/disk/host/console.log"))
    found += list(Path(server.run_dir).glob(f"**/{machine_id}/disk/host/console.log"))
    assert len(found) == 1, found
    return found[0]


def _wait_for_lines(console: Path, text: str, count: int) -> None:
    deadline = time.monotonic() + 60
    while console.read_text(errors="replace").count(text) < count:
        assert time.monotonic() < deadline, console.read_text(errors="replace")[-2000:]
        time.sleep(0.1)


HIBERNATING = "idle, hibernating until the next connection"


def test_a_gvisor_sandbox_hibernates_wakes_guarded_and_hibernates_again(make_server):
    """Under gVisor the agent binds its socket itself, runs as its own uid and
    keeps a launcher of commands: it still hibernates (the launcher ended, root's
    ids taken back for the exec), wakes on the next exec with the connection that
    woke it, guards itself again (every attack of podbay doctor's on it refused), and
    hibernates again once idle."""
    server = make_server(
        {
            "PODBAY_RUNTIME_CLASSES": "gvisor",
            "PODBAY_RUNTIME_WARM_POOL": "0",
            "PODBAY_RUNTIME_AGENT_HIBERNATE_SECONDS": "1",
        }
    )
    token = server.create_deployment("sleepy-gvisor")
    handle = server.attach(token, "sleeper").json()
    assert handle["runtime_class"] == "gvisor"
    assert server.exec(handle, "sh", "-c", "echo kept > /workspace/f").json()["exit_code"] == 0
    console = _console(server, _machine_of(server, handle))
    _wait_for_lines(console, HIBERNATING, 1)
    answer = server.exec(handle, "cat", "/workspace/f")
    assert answer.status_code == 200
    assert answer.json()["stdout"] == "kept\n"
    assert console.read_text().count("serving on") == 2  # started, then woken once
    # Woken, the agent is PID 1 as its own user again, out of the commands' reach.
    ps = server.exec(handle, "ps", "-o", "pid=,user=", "-p", "1").json()
    assert ps["stdout"].split() == ["1", "nobody"], ps
    attacks = server.exec(handle, "python3", "-c", probes.AGENT_ATTACKS).json()
    won = {
        name: outcome
        for name, outcome in json.loads(attacks["stdout"]).items()
        if not outcome.startswith("refused") and name not in probes.OWN_KERNEL_HARMLESS
    }
    assert not won, won
    _wait_for_lines(console, HIBERNATING, 2)
    again = server.exec(handle, "sh", "-c", "cat /workspace/f; ps -e -o pid= | wc -l").json()
    assert again["stdout"].split()[0] == "kept"


def test_a_gvisor_sandbox_with_a_process_left_stays_awake_until_it_ends(make_server):
    """A command's orphan keeps the gVisor agent awake (read from the sandbox's
    /proc: it may belong to the launcher or to PID 1); once it ends, the agent
    hibernates."""
    server = make_server(
        {
            "PODBAY_RUNTIME_CLASSES": "gvisor",
            "PODBAY_RUNTIME_WARM_POOL": "0",
            "PODBAY_RUNTIME_AGENT_HIBERNATE_SECONDS": "1",
        }
    )
    token = server.create_deployment("busy-gvisor")
    handle = server.attach(token, "busy").json()
    started = server.exec(handle, "sh", "-c", "sleep 1000 > /dev/null 2>&1 &").json()
    assert started["exit_code"] == 0
    console = _console(server, _machine_of(server, handle))
    time.sleep(4)  # four times the delay, as the runc case's stays_awake
    assert HIBERNATING not in console.read_text(errors="replace")
    assert server.exec(handle, "pkill", "-x", "sleep").json()["exit_code"] == 0
    _wait_for_lines(console, HIBERNATING, 1)
    assert server.exec(handle, "true").json()["exit_code"] == 0
