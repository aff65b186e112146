"""The agent as a PID namespace's init (PID 1), as it runs in a sandbox:
orphans from anywhere in the namespace are re-parented to it and reaped."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from agent_harness import Agent, start_agent

from podbay.testing.fixtures import host_cannot


def _can_unshare() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", "true"], capture_output=True, check=False
    )
    return probe.returncode == 0


@pytest.fixture
def init_agent(tmp_path: Path, staged: Path) -> Iterator[Agent]:
    if not _can_unshare():
        host_cannot("needs unshare --pid (root)")
    wrapper = ("unshare", "--pid", "--fork", "--mount-proc", "--kill-child=SIGTERM")
    running = start_agent(tmp_path, staged, wrapper)
    yield running
    running.stop()


def _namespace_processes(agent: Agent) -> list[tuple[int, str, str]]:
    """(pid, state, name) of every process in the agent's PID namespace, seen
    from inside (the command doing the looking included)."""
    script = 'for s in /proc/[0-9]*/stat; do cat "$s" 2>/dev/null; echo; done'
    out = agent.exec(["sh", "-c", script]).json()["stdout"]
    rows = []
    for line in out.splitlines():
        if not line.strip():
            continue
        pid, rest = line.split(" (", 1)
        name, fields = rest.rsplit(") ", 1)
        rows.append((int(pid), fields.split()[0], name))
    return rows


def test_runs_as_pid_1_and_reaps_orphans(init_agent: Agent) -> None:
    cmdline = init_agent.exec(["cat", "/proc/1/cmdline"]).json()["stdout"]
    # The agent names itself in its own argument memory (ps shows it by name).
    assert cmdline.split("\0")[0] == "podbay-agent"
    for _ in range(5):
        init_agent.exec(["sh", "-c", "sleep 0.1 & echo $!"])
        init_agent.spawn(["sh", "-c", "(sleep 0.1 &); exit 0"])
    time.sleep(0.6)
    rows = _namespace_processes(init_agent)
    assert [r for r in rows if r[1] == "Z"] == []
    # Only the agent and the looking command itself (sh, maybe cat) are left.
    assert {name for _, _, name in rows} <= {"python", "python3", "python3.11", "sh", "cat"}


def test_signals_from_inside_the_sandbox_cannot_stop_it(init_agent: Agent) -> None:
    for name in ("TERM", "INT", "HUP", "QUIT", "KILL"):
        init_agent.exec(["kill", f"-{name}", "1"])
    init_agent.exec(["pkill", "-f", "podbay"])
    assert init_agent.exec(["true"]).json()["exit_code"] == 0
    assert init_agent.proc.poll() is None


def test_sigkill_from_the_host_ends_the_whole_sandbox(init_agent: Agent) -> None:
    pid = init_agent.spawn(["sh", "-c", "echo $$; exec sleep 60"]).json()["process_id"]
    out = ""
    while not out:
        out = init_agent.client.get(f"/v1/processes/{pid}").json()["stdout"]
    inner = int(out)  # a pid inside the namespace; find the sleeper from outside
    # Children of every thread of the agent (each lists what it forked).
    sleepers = [
        int(p)
        for task in Path(f"/proc/{init_agent.pid}/task").iterdir()
        for p in (task / "children").read_text().split()
    ]
    assert sleepers
    assert inner > 1
    init_agent.stop()
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline and any(Path(f"/proc/{p}").exists() for p in sleepers):
        time.sleep(0.02)
    assert not [p for p in sleepers if Path(f"/proc/{p}").exists()]
