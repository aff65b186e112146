"""The driver conformance suite and isolation probes against the ``vm`` driver.

Real QEMU microVMs under TCG (KVM is never tried here: on hosts where
/dev/kvm exists but guests hang it would stall the suite). One driver for
the module; every machine is destroyed at the end. The network policy is
checked in tests/integration/network/test_network_vm.py.
"""

from __future__ import annotations

import asyncio
import hashlib
import http.client
import os
import socket
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from podbay.runtime import probes
from podbay.runtime.agent_client import AgentClient
from podbay.testing.driver_conformance import DriverConformance, Harness
from podbay.testing.fixtures import small_spec
from podbay.testing.vm import VmSession
from podbay.wire.paths import DIGEST_HEADER

pytestmark = pytest.mark.root

PROBE_DISK = 256 << 20


@pytest.fixture(scope="module")
def vm_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VmSession]:
    # The server's shape is the conformance machines' (small_spec's 512 MiB):
    # only that shape restores from a template.
    session = VmSession.open(tmp_path_factory.mktemp("podbay-vm"), memory_bytes=512 << 20)
    yield session
    session.close()


class TestVmConformance(DriverConformance):
    @pytest.fixture
    def conformance(self, vm_session: VmSession) -> Harness:
        return Harness(
            vm_session.driver,
            vm_session.run,
            vm_session.settings,
            factory="podbay.runtime.vm.driver:VmDriver",
            settle=vm_session.driver.wait_templates,
        )


@pytest.fixture(scope="module")
def pair(vm_session: VmSession) -> tuple[AgentClient, AgentClient]:
    """Two small guests for the isolation probes, kept for the module. They boot
    side by side (each TCG boot keeps one core busy) and cold: a template of
    their shape would be one more boot, in the background of the probes, that
    nothing else here would use."""
    driver = vm_session.driver
    specs = [
        small_spec(
            env={"PODBAY_PROBE": "1"}, pids=64, memory_bytes=256 << 20, disk_bytes=PROBE_DISK
        )
        for _ in range(2)
    ]

    async def boot_both() -> None:
        for spec in specs:
            await driver.create(spec)
        await asyncio.gather(*(driver.start(spec.machine_id) for spec in specs))

    driver.templates_enabled = False
    try:
        vm_session.run(boot_both())
    finally:
        driver.templates_enabled = True
    a, b = (AgentClient(driver.agent_socket(spec.machine_id)) for spec in specs)
    return a, b


def test_guest_runs_its_own_kernel_as_real_root(pair: tuple[AgentClient, AgentClient]) -> None:
    a, _ = pair
    guest = a.sh("uname -r").stdout.strip()
    assert guest
    assert guest != os.uname().release
    assert probes.own_kernel(a) is None
    assert a.sh("id -u").stdout.strip() == "0"
    # No host process in sight: besides the guest kernel's own threads (children
    # of kthreadd, pid 2), only the agent and this command's processes.
    assert probes.guest_processes(a) is None
    rows = [line.split() for line in a.sh("ps -e -o pid=,ppid=").stdout.splitlines()]
    assert len([pid for pid, ppid in rows if "2" not in (pid, ppid)]) < 10, rows


def test_no_platform_credentials_inside(pair: tuple[AgentClient, AgentClient]) -> None:
    a, _ = pair
    assert probes.no_host_environment(a) is None
    env = a.sh("env").stdout
    assert "PODBAY_PROBE=1" in env
    assert "ASTRO" not in env
    assert "TOKEN" not in env


def test_neighbours_see_nothing_of_each_other(pair: tuple[AgentClient, AgentClient]) -> None:
    assert probes.neighbours(*pair) is None


def test_disk_quota(pair: tuple[AgentClient, AgentClient]) -> None:
    assert probes.disk_quota(pair[0], PROBE_DISK) is None


def test_memory_hog_is_killed_inside_and_agent_answers(
    pair: tuple[AgentClient, AgentClient],
) -> None:
    assert probes.memory_hog(pair[0]) is None


def test_fork_bomb_is_contained(pair: tuple[AgentClient, AgentClient]) -> None:
    assert probes.fork_bomb(*pair) is None


def test_removing_python_does_not_stop_the_agent(pair: tuple[AgentClient, AgentClient]) -> None:
    assert probes.python_removed(pair[1]) is None


def _request(
    socket_path: Path, method: str, path: str, body: bytes | None = None
) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("agent", timeout=120)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(120)
    sock.connect(str(socket_path))
    conn.sock = sock
    try:
        headers = (
            {}
            if body is None
            else {
                "Content-Type": "application/octet-stream",
                DIGEST_HEADER: hashlib.sha256(body).hexdigest(),
            }
        )
        conn.request(method, path, body=body, headers=headers)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def test_files_cross_the_channel_intact_beside_other_requests(
    vm_session: VmSession, pair: tuple[AgentClient, AgentClient]
) -> None:
    """Megabytes each way over the multiplexed serial port, flow-controlled,
    while other connections keep being answered; checked at both ends."""
    a, _ = pair
    blob = os.urandom(12 << 20)
    path = "/v1/files?path=/workspace/blob"
    answered: list[int] = []

    def chatter() -> None:
        for _ in range(5):
            answered.append(_request(a.socket_path, "GET", "/v1/info")[0])

    with ThreadPoolExecutor(4) as pool:
        upload = pool.submit(_request, a.socket_path, "PUT", path, blob)
        others = [pool.submit(chatter) for _ in range(3)]
        assert upload.result()[0] == 200, upload.result()
        for other in others:
            other.result()
    assert answered == [200] * 15
    inside = a.sh("sha256sum /workspace/blob").stdout.split()[0]
    assert inside == hashlib.sha256(blob).hexdigest()
    status, back = _request(a.socket_path, "GET", path)
    assert status == 200
    assert back == blob


def test_gc_beside_running_machines_leaves_their_networks(
    vm_session: VmSession, pair: tuple[AgentClient, AgentClient]
) -> None:
    """gc reclaims the networks of machines that no longer exist
    (tests/integration/runtime/test_gc_classes.py), never a running one's."""
    from podbay.runtime.network import netns
    from podbay.runtime.vm import gc

    driver, network = vm_session.driver, vm_session.driver.network
    running = {
        machine_id: network.slirps.recorded(
            network.machine_dir(machine_id), network.netns_path(machine_id)
        )
        for machine_id in driver.machine_ids()
        if netns.is_mounted(network.netns_path(machine_id))
    }
    assert len(running) >= 2, running
    assert None not in running.values(), running
    removed = vm_session.run(gc.collect(driver))
    assert not any(machine_id in line for line in removed for machine_id in running), removed
    for machine_id, slirp_pid in running.items():
        assert netns.is_mounted(network.netns_path(machine_id)), machine_id
        assert (
            network.slirps.recorded(network.machine_dir(machine_id), network.netns_path(machine_id))
            == slirp_pid
        )
    for agent in pair:
        assert agent.sh("echo up").stdout.strip() == "up"
