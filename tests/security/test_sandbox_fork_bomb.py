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
from collections.abc import Iterator

import httpx
import pytest

from podbay.errors import AgentError, AgentUnreachable
from podbay.runtime.agent_client import AgentClient
from podbay.runtime.base import MachineState
from podbay.settings import Settings
from podbay.testing.fixtures import DriverSession, Machines, session_for, settings_for
from podbay.wire import paths

pytestmark = [pytest.mark.root, pytest.mark.alone, pytest.mark.timeout(240)]

#: Leaves the exec's session, then forks for ever (each child too).
BOMB = (
    "import os, time\nos.setsid()\nwhile True:\n    try:\n        os.fork()\n"
    "    except OSError:\n        time.sleep(0.05)\n"
)


#: The classic, in sh: every call forks two more, each in the background.
SH_BOMB = "bomb() { bomb | bomb & }; bomb"


@pytest.fixture(scope="module")
def gvisor_settings(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Settings]:
    yield from settings_for(tmp_path_factory, "runsc")


@pytest.fixture(scope="module")
def gvisor_session(gvisor_settings: Settings) -> Iterator[DriverSession]:
    yield from session_for(gvisor_settings)


def others(agent: AgentClient) -> list[str]:
    """The sandbox's processes but the agent, its launcher (gVisor's: started
    again by the next command after a kill-all) and this probe's own."""
    listing = agent.exec(["ps", "-e", "-o", "pid=,args="], timeout_ms=10_000).stdout
    return [
        line.strip()
        for line in listing.splitlines()
        if line.split()[0] != "1"
        and "ps -e -o" not in line
        and line.split()[1] != "/.podbay/launcher"
    ]


def recovers(agent: AgentClient, within: float = 20.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            if agent.sh("echo back", timeout_ms=5000).stdout.strip() == "back":
                return True
        except (AgentError, AgentUnreachable):  # no thread or no pid for the request yet
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


def kill_all(agent: AgentClient) -> int:
    transport = httpx.HTTPTransport(uds=str(agent.socket_path))
    with httpx.Client(transport=transport, base_url="http://agent", timeout=30) as client:
        return client.delete(paths.PROCESSES).status_code


def test_a_sh_bomb_at_the_default_limits_leaves_gvisor_running(
    gvisor_session: DriverSession,
) -> None:
    """The default limits (pids 256, 512 MiB): each guest process costs gVisor
    (ptrace) ~66 host threads and ~2 MiB of the sandbox's memory, so 256 of
    them filled its memory (or, lower, its host pids budget) and gVisor, which
    has no OOM killer, ended: the agent stopped answering, processes were lost.
    Now the guest's limit is what the memory holds (runsc.guest_pids_cap)."""
    machines = Machines(gvisor_session)
    try:
        m = machines.up()  # the defaults
        bomb = m.agent.exec(["sh", "-c", SH_BOMB], timeout_ms=10_000)
        assert bomb.exit_code is not None
        # The bomb forks until the guest's limit, where forks fail and it burns out.
        assert recovers(m.agent, within=120), "the agent stopped answering"
        assert kill_all(m.agent) == 204
        assert recovers(m.agent), "no exec after kill-all"
        assert others(m.agent) == []
        state = gvisor_session.run(gvisor_session.driver.state(m.id))
        assert state == MachineState.RUNNING, state
    finally:
        machines.destroy_all()
