"""Every child is reaped: the agent's commands, their orphans, no zombie left."""

from __future__ import annotations

import time
from pathlib import Path

from agent_harness import Agent


def _children(parent: int) -> list[tuple[int, str]]:
    """(pid, state) of every process whose parent is ``parent``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == parent:
            found.append((int(entry.name), fields[0]))
    return found


def test_no_zombies_after_execs_processes_and_orphans(fresh_agent: Agent) -> None:
    agent = fresh_agent
    orphan_pids = []
    for _ in range(10):
        body = agent.exec(["sh", "-c", "sleep 0.2 & echo $!"]).json()
        orphan_pids.append(int(body["stdout"]))
        agent.exec(["true"])
        agent.exec(["sh", "-c", "exit 3"])
    ids = [
        agent.spawn(["sh", "-c", "(sleep 0.1 &); exit 0"]).json()["process_id"] for _ in range(10)
    ]
    for pid in ids:
        agent.wait_exited(pid)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        if not _children(agent.pid) and not any(Path(f"/proc/{p}").exists() for p in orphan_pids):
            break
        time.sleep(0.05)
    assert _children(agent.pid) == []  # no zombie, no orphan left behind
    assert not [p for p in orphan_pids if Path(f"/proc/{p}").exists()]


def test_sigterm_kills_what_the_agent_started_and_exits_zero(fresh_agent: Agent) -> None:
    pid = fresh_agent.spawn(["sh", "-c", "echo $$; exec sleep 60"]).json()["process_id"]
    out = ""
    while not out:
        out = fresh_agent.client.get(f"/v1/processes/{pid}").json()["stdout"]
    sleeper = int(out)
    fresh_agent.stop()
    assert fresh_agent.proc.returncode == 0
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline:
        stat = Path(f"/proc/{sleeper}/stat")
        if not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] == "Z":
            break
        time.sleep(0.02)
    else:
        raise AssertionError("the agent's process survived its shutdown")
