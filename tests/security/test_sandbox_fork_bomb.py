"""Fork bombs that leave their exec's process group and session.

The attack: a command's descendant calls ``setsid()`` (so a ``killpg`` of the
command's group no longer reaches it) and forks until the sandbox's pids
limit. Before, the exec's deadline killed the group only: the bomb outlived
its exec and pinned the sandbox, whose agent could then start nothing. Now
the deadline takes the command's whole tree, and ``DELETE /v1/processes``
kills everything in the sandbox but the agent (even a bomb whose lineage is
lost, while the sandbox is pinned at its limit).
"""

from __future__ import annotations

import time

import httpx
import pytest

from podbay.runtime.agent_client import AgentClient
from podbay.testing.fixtures import Machines
from podbay.wire import paths

pytestmark = [pytest.mark.root, pytest.mark.timeout(240)]

#: Leaves the exec's session, then forks for ever (each child too).
BOMB = (
    "import os, time\nos.setsid()\nwhile True:\n    try:\n        os.fork()\n"
    "    except OSError:\n        time.sleep(0.05)\n"
)


def others(agent: AgentClient) -> list[str]:
    """The sandbox's processes but the agent and this probe's own."""
    listing = agent.exec(["ps", "-e", "-o", "pid=,args="], timeout_ms=10_000).stdout
    return [
        line.strip()
        for line in listing.splitlines()
        if line.split()[0] != "1" and "ps -e -o" not in line
    ]


def recovers(agent: AgentClient, within: float = 20.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            if agent.sh("echo back", timeout_ms=5000).stdout.strip() == "back":
                return True
        except Exception:  # no thread or no pid to be had for the request yet
            pass
        time.sleep(0.3)
    return False


def test_exec_deadline_takes_the_whole_tree(oci_machines: Machines) -> None:
    m = oci_machines.up(pids=64)
    result = m.agent.exec(["sh", "-c", f"python3 -c '{BOMB}' & sleep 300"], timeout_ms=3000)
    assert result.timed_out
    assert recovers(m.agent), "the bomb outlived its exec and pins the sandbox"
    assert others(m.agent) == []


def test_kill_all_processes_but_the_agent(oci_machines: Machines) -> None:
    m = oci_machines.up(pids=64)
    # Lineage lost on purpose: the bomb's parent exits at once, so the bomb is
    # the agent's orphan, in a session of its own; the exec itself returns.
    started = m.agent.sh(f"setsid python3 -c '{BOMB}' </dev/null >/dev/null 2>&1 &")
    assert started.ok
    time.sleep(2)
    transport = httpx.HTTPTransport(uds=str(m.agent.socket_path))
    with httpx.Client(transport=transport, base_url="http://agent", timeout=30) as client:
        answer = client.delete(paths.PROCESSES)
    assert answer.status_code == 204, answer.text
    assert recovers(m.agent), "the sandbox stayed pinned after killing all its processes"
    assert others(m.agent) == []
    assert m.agent.info().version  # the agent itself lives on
