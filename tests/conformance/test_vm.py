"""The driver conformance suite and isolation probes against the ``vm`` driver.

Real QEMU microVMs under TCG (KVM is never tried here: on hosts where
/dev/kvm exists but guests hang it would stall the suite). One driver for
the module; every machine is destroyed at the end. The network policy is
checked in tests/integration/network/test_network_vm.py.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from podbay.runtime import probes
from podbay.runtime.agent_client import AgentClient
from podbay.testing.driver_conformance import DriverConformance, Harness
from podbay.testing.fixtures import small_spec
from podbay.testing.vm import VmSession

pytestmark = pytest.mark.root

PROBE_DISK = 256 << 20


@pytest.fixture(scope="module")
def vm_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VmSession]:
    session = VmSession.open(tmp_path_factory.mktemp("podbay-vm"))
    yield session
    session.close()


class TestVmConformance(DriverConformance):
    @pytest.fixture
    def conformance(self, vm_session: VmSession) -> Harness:
        return Harness(vm_session.driver, vm_session.run, vm_session.settings,
                       factory="podbay.runtime.vm.driver:VmDriver")


@pytest.fixture(scope="module")
def pair(vm_session: VmSession) -> Iterator[tuple[AgentClient, AgentClient]]:
    """Two small guests for the isolation probes, kept for the module."""
    clients = []
    for _ in range(2):
        spec = small_spec(env={"PODBAY_PROBE": "1"}, pids=64, memory_bytes=256 << 20,
                          disk_bytes=PROBE_DISK)
        clients.append(AgentClient(vm_session.driver.agent_socket(vm_session.up(spec))))
    yield clients[0], clients[1]


def test_guest_runs_its_own_kernel_as_real_root(pair: tuple[AgentClient, AgentClient]) -> None:
    a, _ = pair
    guest = a.sh("uname -r").stdout.strip()
    assert guest and guest != os.uname().release
    assert a.sh("id -u").stdout.strip() == "0"
    # No host process in sight: besides the guest kernel's own threads (children
    # of kthreadd, pid 2), only the agent, the mux and this command's processes.
    rows = [line.split() for line in a.sh("ps -e -o pid=,ppid=").stdout.splitlines()]
    user = [pid for pid, ppid in rows if "2" not in (pid, ppid)]
    assert len(user) < 10, user


def test_no_platform_credentials_inside(pair: tuple[AgentClient, AgentClient]) -> None:
    a, _ = pair
    assert probes.no_host_environment(a) is None
    env = a.sh("env").stdout
    assert "PODBAY_PROBE=1" in env and "ASTRO" not in env and "TOKEN" not in env


def test_neighbours_see_nothing_of_each_other(pair: tuple[AgentClient, AgentClient]) -> None:
    assert probes.neighbours(*pair) is None


def test_disk_quota(pair: tuple[AgentClient, AgentClient]) -> None:
    assert probes.disk_quota(pair[0], PROBE_DISK) is None


def test_memory_hog_is_killed_inside_and_agent_answers(
        pair: tuple[AgentClient, AgentClient]) -> None:
    assert probes.memory_hog(pair[0]) is None


def test_fork_bomb_is_contained(pair: tuple[AgentClient, AgentClient]) -> None:
    assert probes.fork_bomb(*pair) is None


def test_removing_python_does_not_stop_the_agent(pair: tuple[AgentClient, AgentClient]) -> None:
    assert probes.python_removed(pair[1]) is None
