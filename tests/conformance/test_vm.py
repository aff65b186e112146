"""The driver conformance suite and isolation probes against the ``vm`` driver.

Real QEMU microVMs under TCG (KVM is never tried here: on hosts where
/dev/kvm exists but guests hang it would stall the suite). One driver for
the module; every machine is destroyed at the end.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from podbay.runtime.agent_client import AgentClient
from podbay.runtime.vm.driver import VmDriver
from podbay.settings import Settings
from podbay.testing.driver_conformance import DriverConformance, Harness
from podbay.testing.fixtures import mark_owner, require_host, sandbox_settings, small_spec

pytestmark = pytest.mark.root

T = TypeVar("T")


def _vm_host_problem() -> str | None:
    if shutil.which("qemu-system-x86_64") is None:
        return "needs qemu-system-x86"
    if not list(Path("/boot").glob("vmlinuz-*-cloud-amd64")):
        return "needs linux-image-cloud-amd64"
    return None


class VmSession:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.runner = asyncio.Runner()
        self.driver = VmDriver(settings)

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.runner.run(coro)

    def close(self) -> None:
        try:
            for machine_id in self.driver.machine_ids():
                self.run(self.driver.destroy(machine_id))
            self.run(self.driver.close())
        finally:
            self.runner.close()


@pytest.fixture(scope="module")
def vm_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VmSession]:
    require_host()
    problem = _vm_host_problem()
    if problem is not None:
        pytest.fail(f"this host cannot run vm sandboxes: {problem}")
    settings = sandbox_settings(tmp_path_factory.mktemp("podbay-vm"))
    mark_owner(settings)
    session = VmSession(settings)
    session.run(session.driver.prepare())
    yield session
    session.close()


class TestVmConformance(DriverConformance):
    @pytest.fixture
    def conformance(self, vm_session: VmSession) -> Harness:
        return Harness(vm_session.driver, vm_session.run, vm_session.settings,
                       factory="podbay.runtime.vm.driver:VmDriver")


@pytest.fixture(scope="module")
def probe_machine(vm_session: VmSession) -> Iterator[AgentClient]:
    spec = small_spec(env={"PODBAY_PROBE": "1"}, pids=64, memory_bytes=256 << 20,
                      disk_bytes=256 << 20)
    vm_session.run(vm_session.driver.create(spec))
    vm_session.run(vm_session.driver.start(spec.machine_id))
    yield AgentClient(vm_session.driver.agent_socket(spec.machine_id))
    vm_session.run(vm_session.driver.destroy(spec.machine_id))


def test_guest_runs_its_own_kernel(probe_machine: AgentClient) -> None:
    guest = probe_machine.sh("uname -r").stdout.strip()
    assert guest and guest != os.uname().release
    # Real root inside, and no host processes to see.
    assert probe_machine.sh("id -u").stdout.strip() == "0"
    assert probe_machine.sh("cat /proc/1/comm").stdout.strip().startswith("python")


def test_pids_limit_holds(probe_machine: AgentClient) -> None:
    result = probe_machine.sh("for i in $(seq 100); do sleep 5 & done 2>&1; wait",
                              timeout_ms=60_000)
    assert "fork" in (result.stdout + result.stderr).lower() or result.exit_code != 0


def test_disk_limit_holds(probe_machine: AgentClient) -> None:
    result = probe_machine.sh("dd if=/dev/zero of=/workspace/big bs=1M count=400 2>&1; "
                              "rm -f /workspace/big", timeout_ms=120_000)
    assert "No space left" in result.stdout


def test_memory_limit_holds(probe_machine: AgentClient) -> None:
    result = probe_machine.exec(["python3", "-c", "b = bytearray(400 << 20); print('fit')"],
                                timeout_ms=120_000)
    assert result.exit_code != 0 and "fit" not in result.stdout
    assert probe_machine.info()  # the guest survived its OOM


def test_no_network_and_no_credentials(probe_machine: AgentClient) -> None:
    env = probe_machine.sh("env").stdout
    assert "ASTRO" not in env and "PODBAY_PROBE=1" in env
    # No interface but loopback: the host's services and its network are out of reach.
    links = probe_machine.sh("ls /sys/class/net").stdout.split()
    assert links == ["lo"]
    refused = probe_machine.sh("curl -sS -m 5 http://10.0.2.2:8700/ 2>&1; echo rc=$?")
    assert "rc=0" not in refused.stdout
