"""One sandbox's connections must not grow its network helper without bound.

Every connection a sandbox opens is a host socket in its slirp4netns, which
used to run outside every limit: 15,000 connections took it to 3.8 GiB and
15k fds. This floods slirp4netns from one sandbox with more connections than
its descriptor budget allows, to a test host of our own, and expects the
helper held to its budget (fds, its own memory cgroup) while a neighbour
sandbox's network keeps working. The budget is lowered to 256 descriptors
(``runtime.slirp_max_fds``, the setting an operator has) for this module's
sandboxes, so a few hundred connections exhaust it, not the default's 4,700.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from podbay.runtime.network import slirp as slirp_module
from podbay.settings import Settings
from podbay.testing.fixtures import DriverSession, Machines, session_for, settings_for
from podbay.testing.flood import HOLDING_SERVER, flood

pytestmark = [pytest.mark.root, pytest.mark.alone]

PID = os.getpid()
#: A /30 of TEST-NET-3 above the ones the network suite uses (4k+1, 4k+2 <= 242).
BASE = 244 + 4 * (PID % 3)
HOST_SIDE, TEST_HOST = f"203.0.113.{BASE + 1}", f"203.0.113.{BASE + 2}"
PORT = 8080
BUDGET = slirp_module.budget("unused", max_fds=256)

PROBE = r"""
import socket, sys
socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=5).close()
print("reached")
"""


@pytest.fixture(scope="module")
def oci_settings(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Settings]:
    yield from settings_for(tmp_path_factory, slirp_max_fds=BUDGET.max_fds)


@pytest.fixture(scope="module")
def oci_session(oci_settings: Settings) -> Iterator[DriverSession]:
    yield from session_for(oci_settings)


@dataclass
class Upstream:
    netns: Path
    server: subprocess.Popen[bytes]


def sh(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, timeout=30)


@pytest.fixture
def test_host(tmp_path: Path) -> Iterator[Upstream]:
    """A network namespace joined to the host by a veth pair, with a server that
    accepts and holds every connection."""
    netns, link, peer = tmp_path / "testhost", f"pbsl{PID}h", f"pbsl{PID}t"
    subprocess.run(["ip", "link", "del", link], capture_output=True, check=False)
    netns.touch()
    sh("unshare", f"--net={netns}", "true")
    server = None
    try:
        sh("ip", "link", "add", link, "type", "veth", "peer", "name", peer)
        sh("ip", "link", "set", peer, "netns", str(netns))
        sh("ip", "addr", "add", f"{HOST_SIDE}/30", "dev", link)
        sh("ip", "link", "set", link, "up")
        inside = ["nsenter", f"--net={netns}", "--", "ip"]
        sh(*inside, "link", "set", "lo", "up")
        sh(*inside, "addr", "add", f"{TEST_HOST}/30", "dev", peer)
        sh(*inside, "link", "set", peer, "up")
        sh(*inside, "route", "add", "default", "via", HOST_SIDE)
        server = subprocess.Popen(
            ["nsenter", f"--net={netns}", "--", sys.executable, "-c", HOLDING_SERVER, str(PORT)],
            stdout=subprocess.PIPE,
        )
        assert server.stdout is not None
        assert server.stdout.readline() == b"ready\n"
        yield Upstream(netns, server)
    finally:
        if server is not None:
            server.kill()
            server.wait()
            if server.stdout is not None:
                server.stdout.close()
        subprocess.run(["ip", "link", "del", link], capture_output=True, check=False)
        subprocess.run(["umount", str(netns)], capture_output=True, check=False)


def slirp_pid(session: DriverSession, machine_id: str) -> int:
    pid_file = Path(session.settings.runtime.run_dir) / machine_id / "slirp.pid"
    return int(pid_file.read_text().split()[0])


def test_a_flood_of_connections_stays_within_the_helpers_budget(
    oci_machines: Machines, oci_session: DriverSession, test_host: Upstream
) -> None:
    flooder, neighbour = oci_machines.up(), oci_machines.up()
    slirp = slirp_pid(oci_session, flooder.id)
    # It sits in cgroups of its own (memory, pids, CPU), not the host's root.
    cgroup = Path(f"/proc/{slirp}/cgroup").read_text()
    assert f"-net/{flooder.id}" in cgroup, cgroup
    driver = oci_session.driver
    rel = f"{driver.layout.cgroup_parent}-net/{flooder.id}".strip("/")  # type: ignore[attr-defined]
    unified = driver.cgroups.version == 2  # type: ignore[attr-defined]
    memory = Path("/sys/fs/cgroup") / ("" if unified else "memory") / rel
    attempts = BUDGET.max_fds + 200
    done = flood(flooder.agent, TEST_HOST, PORT, attempts, [slirp])
    # The helper never held more sockets than its budget: the rest failed.
    assert done.most[slirp] <= BUDGET.max_fds, done
    assert done.failed > 0
    assert done.held < attempts
    # Its memory stayed within the budget (at the limit the kernel ends it: the
    # flooding sandbox then has lost its own network, nobody else's).
    peak_file = memory / (
        "memory.peak" if (memory / "memory.peak").exists() else "memory.max_usage_in_bytes"
    )
    assert int(peak_file.read_text()) <= BUDGET.memory_bytes
    limit_file = memory / ("memory.max" if unified else "memory.limit_in_bytes")
    assert int(limit_file.read_text()) == BUDGET.memory_bytes
    # The descriptor cap came first: the flooder's helper lives on, with the
    # connections it holds.
    os.kill(slirp, 0)
    # The neighbour's network never noticed.
    reached = neighbour.agent.exec(
        ["python3", "-c", PROBE, TEST_HOST, str(PORT)], timeout_ms=30_000
    )
    assert reached.ok, reached
    assert reached.stdout.strip() == "reached", reached
