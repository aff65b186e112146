"""End to end: real sandboxes made by the OCI driver (runc and runsc) on this network."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from _nethelpers import METADATA_ADDRESS, PROBE, PUBLIC_HOST_ADDRESS, NetLab

from podbay.runtime.network.policy import SLIRP_GATEWAY
from podbay.settings import Settings
from podbay.testing.fixtures import (
    OCI_RUNTIMES,
    DriverSession,
    Machine,
    Machines,
    session_for,
    settings_for,
)


@pytest.fixture(scope="module", params=OCI_RUNTIMES)
def oci_settings(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Settings]:
    """Every probe here runs against runc and against runsc (gVisor)."""
    yield from settings_for(tmp_path_factory, request.param)


@pytest.fixture(scope="module")
def oci_session(oci_settings: Settings) -> Iterator[DriverSession]:
    yield from session_for(oci_settings)


def probe_inside(machine: Machine, targets: list[tuple[str, str, int, str]]) -> list[list]:
    done = machine.agent.exec(["python3", "-c", PROBE, json.dumps(targets)], timeout_ms=30_000)
    assert done.ok, done.stderr
    return json.loads(done.stdout)


def test_real_sandbox_network(
    oci_machines: Machines, oci_session: DriverSession, testnet: NetLab
) -> None:
    assert oci_session.settings.runtime.network
    gvisor = Path(oci_session.settings.runtime.oci_runtime).name == "runsc"
    m = oci_machines.up()
    assert "nameserver 10.0.2.3" in m.sh("cat /etc/resolv.conf").stdout
    assert "tap0" in m.sh("cat /proc/net/dev").stdout
    loopback = testnet.servers["127.0.0.1"]
    targets = [
        ("tcp", testnet.testhost_address, testnet.testhost_port, ""),
        ("tcp", SLIRP_GATEWAY, loopback.port, ""),
        ("tcp", METADATA_ADDRESS, testnet.servers[METADATA_ADDRESS].port, ""),
        ("tcp", PUBLIC_HOST_ADDRESS, testnet.servers[PUBLIC_HOST_ADDRESS].port, ""),
    ] + [
        ("tcp", address, server.port, "")
        for address, server in testnet.servers.items()
        if ":" not in address and not address.startswith("127.")
    ]
    before = {a: s.accepted for a, s in testnet.servers.items()}
    results = probe_inside(m, targets)
    assert results[0][0] == "connected:testhost\n"
    # runc's packets meet the inet rules (a reset at once); gVisor's netstack
    # writes to tap0 directly and meets the egress hook, which can only drop.
    refused = {"ECONNREFUSED", "timeout"} if gvisor else {"ECONNREFUSED"}
    for target, (result, _) in zip(targets[1:], results[1:], strict=True):
        assert result in refused, (target, result)
    assert {a: s.accepted for a, s in testnet.servers.items()} == before
    # root in the sandbox holds no capability over its network namespace.
    raw = m.sh("python3 -c 'import socket; socket.socket(socket.AF_INET, socket.SOCK_RAW, 1)'")
    assert not raw.ok and "ermission" in raw.stderr
    down = m.sh("python3 -c \"open('/proc/sys/net/ipv4/ip_forward', 'w').write('1')\"")
    if gvisor:
        # That file is gVisor's own; the host-owned namespace is untouched.
        netns = Path(oci_session.settings.runtime.run_dir) / m.id / "netns"
        forward = subprocess.run(
            ["nsenter", f"--net={netns}", "cat", "/proc/sys/net/ipv4/ip_forward"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert forward.strip() == "0"
    else:
        assert not down.ok


def test_destroy_leaves_no_network(oci_machines: Machines, oci_session: DriverSession) -> None:
    m = oci_machines.up()
    run_dir = Path(oci_session.settings.runtime.run_dir)
    netns = run_dir / m.id / "netns"
    pid_file = run_dir / m.id / "slirp.pid"
    slirp = int(pid_file.read_text().split()[0]) if pid_file.exists() else None
    oci_session.run(oci_session.driver.destroy(m.id))
    assert not netns.exists()
    if slirp is not None:
        assert not Path(f"/proc/{slirp}").exists()
    with open("/proc/self/mountinfo") as f:
        assert str(netns) not in f.read()
