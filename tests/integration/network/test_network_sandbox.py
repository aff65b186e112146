"""End to end: real sandboxes made by the OCI driver (runc and runsc) on this network."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from _namedservers import HTTP_PORT, NAMED_PROBE, TLS_PORT, NamedServers
from _nethelpers import METADATA_ADDRESS, PROBE, PUBLIC_HOST_ADDRESS, NetLab

from podbay.domain.egress import EgressPolicy
from podbay.runtime.network.policy import SLIRP_GATEWAY
from podbay.settings import Settings
from podbay.testing.fixtures import (
    OCI_RUNTIMES,
    DriverSession,
    Machine,
    Machines,
    session_for,
    settings_for,
    small_spec,
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
    assert not raw.ok
    assert "ermission" in raw.stderr
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


def test_the_egress_policy_holds_in_a_real_sandbox(
    oci_machines: Machines, oci_session: DriverSession, testnet: NetLab
) -> None:
    """runc's packets meet ``inet podbay``; gVisor's netstack writes to tap0 and
    meets ``netdev podbay_tap``: both carry the sandbox's policy."""
    gvisor = Path(oci_session.settings.runtime.oci_runtime).name == "runsc"
    refused = {"ECONNREFUSED", "timeout"} if gvisor else {"ECONNREFUSED", "EPERM"}
    m = oci_machines.up()
    network = oci_session.driver.network
    testhost = ("tcp", testnet.testhost_address, testnet.testhost_port, "")
    dns = ("udp", "10.0.2.3", 53, "123401000001000000000000076578616d706c6503636f6d0000010001")
    allowed = EgressPolicy.parse({"allow": [testnet.testhost_address]})
    oci_session.run(network.set_egress(m.id, allowed))
    [(result, _)] = probe_inside(m, [testhost])
    assert result == "connected:testhost\n"
    # A live change is in force once set_egress returns.
    oci_session.run(network.set_egress(m.id, EgressPolicy.parse({"internet": False})))
    results = probe_inside(m, [testhost, dns])
    assert results[0][0] in refused, results
    assert results[1][0] in refused | {"EPERM", "sent-no-answer"}, results
    oci_session.run(network.set_egress(m.id, EgressPolicy.parse({"deny": ["0.0.0.0/1"]})))
    [(result, _)] = probe_inside(m, [testhost])  # 203.0.113.x: outside the denied half
    assert result == "connected:testhost\n"
    oci_session.run(network.set_egress(m.id, EgressPolicy.parse({"deny": ["128.0.0.0/1"]})))
    [(result, _)] = probe_inside(m, [testhost])
    assert result in refused


def test_the_egress_policy_is_kept_across_stop_and_start(
    oci_machines: Machines, oci_session: DriverSession, testnet: NetLab
) -> None:
    """The policy is part of the machine's record: a new incarnation (a start
    after a stop, an adoption) loads it before its first packet."""
    gvisor = Path(oci_session.settings.runtime.oci_runtime).name == "runsc"
    refused = {"ECONNREFUSED", "timeout"} if gvisor else {"ECONNREFUSED"}
    driver = oci_session.driver
    denied = EgressPolicy.parse({"deny": [testnet.testhost_address]})
    spec = dataclasses.replace(small_spec(), egress=denied)
    oci_machines.ids.append(spec.machine_id)
    oci_session.run(driver.create(spec))
    oci_session.run(driver.start(spec.machine_id))
    m = Machine(spec.machine_id, oci_session)
    testhost = ("tcp", testnet.testhost_address, testnet.testhost_port, "")
    [(result, _)] = probe_inside(m, [testhost])
    assert result in refused
    oci_session.run(driver.stop(m.id))
    oci_session.run(driver.start(m.id))
    [(result, _)] = probe_inside(m, [testhost])
    assert result in refused
    # Changed while stopped: the next start has the new one.
    oci_session.run(driver.stop(m.id))
    oci_session.run(driver.set_egress(m.id, EgressPolicy()))
    oci_session.run(driver.start(m.id))
    [(result, _)] = probe_inside(m, [testhost])
    assert result == "connected:testhost\n"


def test_domain_rules_in_a_real_sandbox(
    oci_machines: Machines, oci_session: DriverSession, testnet: NetLab, dnsmasq: str
) -> None:
    """runc's lookups reach podbay's resolver (10.0.2.3 on the namespace's lo):
    an allowed name resolves and opens its address, another name is refused.
    gVisor's netstack sends its lookups on tap0 to slirp's forwarder, which an
    allow list refuses: nothing resolves there (closed, not bypassed)."""
    gvisor = Path(oci_session.settings.runtime.oci_runtime).name == "runsc"
    network = oci_session.driver.network
    network.dns_upstream = dnsmasq
    m = oci_machines.up()
    policy = EgressPolicy.parse({"allow": ["allowed.test"]})
    oci_session.run(network.set_egress(m.id, policy))
    testhost = ("tcp", testnet.testhost_address, testnet.testhost_port, "")

    def resolve(name: str) -> str:
        # The loop serves the resolver: the lookup runs beside it.
        done = oci_session.run(
            asyncio.to_thread(m.sh, f"getent ahostsv4 {name} | head -n1", timeout_ms=30_000)
        )
        return done.stdout.split()[0] if done.stdout.strip() else ""

    if gvisor:
        assert resolve("allowed.test") == ""
        [(result, _)] = probe_inside(m, [testhost])
        assert result in {"ECONNREFUSED", "timeout"}
    else:
        assert resolve("other.test") == ""
        assert resolve("allowed.test") == testnet.testhost_address
        [(result, _)] = oci_session.run(asyncio.to_thread(probe_inside, m, [testhost]))
        assert result == "connected:testhost\n"
    # A deny list of names under an open default: a denied name never resolves
    # (gVisor: no lookup does, rather than one round podbay's resolver).
    oci_session.run(network.set_egress(m.id, EgressPolicy.parse({"deny": ["other.test"]})))
    assert resolve("other.test") == ""
    assert resolve("allowed.test") == ("" if gvisor else testnet.testhost_address)


#: A cut connection, seen from inside (a reset; a read begun after it: an end).
CUT = {"ECONNRESET", "closed", "ssl:UNEXPECTED_EOF_WHILE_READING", "EPIPE"}


def named_inside(
    machine: Machine, session: DriverSession, targets: list[tuple[str, str, int, str]]
) -> list[str]:
    """NAMED_PROBE in the sandbox, beside the session's loop (which serves the
    name check and the resolver)."""
    done = session.run(
        asyncio.to_thread(
            machine.agent.exec,
            ["python3", "-c", NAMED_PROBE, json.dumps(targets)],
            timeout_ms=60_000,
        )
    )
    assert done.ok, done.stderr
    return list(json.loads(done.stdout))


def test_sni_and_host_are_checked_in_a_real_sandbox(
    oci_machines: Machines,
    oci_session: DriverSession,
    testnet: NetLab,
    dnsmasq: str,
    named: NamedServers,
) -> None:
    """allowed.test and denied.test are the same address. runc's connections
    meet the redirect to the name check: a TLS ClientHello or an HTTP request
    naming denied.test is cut, one naming allowed.test passes, live. gVisor's
    netstack writes its frames to tap0 and never meets it: names go unchecked
    there (docs/network.md says so)."""
    gvisor = Path(oci_session.settings.runtime.oci_runtime).name == "runsc"
    network = oci_session.driver.network
    network.dns_upstream = dnsmasq
    m = oci_machines.up()
    host = testnet.testhost_address
    targets = [
        ("tls", host, TLS_PORT, "allowed.test"),
        ("tls", host, TLS_PORT, "denied.test"),
        ("http", host, HTTP_PORT, "allowed.test"),
        ("http", host, HTTP_PORT, "denied.test"),
    ]
    oci_session.run(network.set_egress(m.id, EgressPolicy.parse({"deny": ["denied.test"]})))
    results = named_inside(m, oci_session, targets)
    if gvisor:
        unchecked = ["tls:allowed.test", "tls:denied.test", "http:allowed.test", "http:denied.test"]
        assert results == unchecked, results
        return
    assert results[0] == "tls:allowed.test", results
    assert results[1] in CUT, results
    assert results[2] == "http:allowed.test", results
    assert results[3] in CUT, results
    # Straight to the check (it listens on the sandbox's own 127.0.0.1): no relay.
    port = network._checks[m.id].port
    [straight] = named_inside(m, oci_session, [("tls", "127.0.0.1", port, "allowed.test")])
    assert straight in CUT, straight
    # An allow list of names: the address opens once allowed.test resolves,
    # and on it only allowed names pass.
    policy = EgressPolicy.parse({"allow": ["allowed.test"], "deny": ["denied.test"]})
    oci_session.run(network.set_egress(m.id, policy))
    resolved = oci_session.run(
        asyncio.to_thread(m.sh, "getent ahostsv4 allowed.test | head -n1", timeout_ms=30_000)
    )
    assert resolved.stdout.split()[0] == host
    results = named_inside(m, oci_session, [*targets, ("tls", host, TLS_PORT, "unlisted.test")])
    assert results[0] == "tls:allowed.test", results
    assert results[2] == "http:allowed.test", results
    assert {results[1], results[3], results[4]} <= CUT, results
    # A policy without names: no check any more.
    oci_session.run(network.set_egress(m.id, EgressPolicy.parse({"deny": ["192.0.2.0/24"]})))
    assert named_inside(m, oci_session, targets[1:2]) == ["tls:denied.test"]
