"""End to end: real sandboxes made by the OCI driver (runc and runsc) on this network."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from _namedservers import HTTP_PORT, NAMED_PROBE, TLS_PORT, NamedServers
from _nethelpers import (
    DNS_PROBE,
    METADATA_ADDRESS,
    PROBE,
    PUBLIC_HOST_ADDRESS,
    REFUSED_RCODE,
    NetLab,
)

from podbay.domain.egress import EgressPolicy
from podbay.runtime.base import MachineState
from podbay.runtime.network import slirpdns
from podbay.runtime.network.policy import SLIRP_DNS, SLIRP_GATEWAY, slirp_names_table
from podbay.settings import Settings
from podbay.testing.driver_conformance import node_killed_once_ready
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
    """Every lookup a sandbox makes is podbay's resolver's to answer: runc's
    reach it at 10.0.2.3 on the namespace's lo; gVisor's netstack sends its own
    on tap0 to slirp's forwarder, which for a runsc sandbox asks podbay's
    resolver on a host-loopback address of that sandbox's (slirp.resolv.conf).
    Allowed names (and a wildcard's) resolve and open their addresses, others
    are REFUSED, a literal address no allowed name gave and another resolver
    stay closed; a live change applies; a restarted node serves it again
    (closed, not open, while it is down)."""
    gvisor = Path(oci_session.settings.runtime.oci_runtime).name == "runsc"
    refused = {"ECONNREFUSED", "timeout"} if gvisor else {"ECONNREFUSED"}
    network = oci_session.driver.network
    network.dns_upstream = dnsmasq
    m = oci_machines.up()
    run_dir = Path(oci_session.settings.runtime.run_dir)
    testhost = ("tcp", testnet.testhost_address, testnet.testhost_port, "")
    other = testnet.testhost_address.rsplit(".", 1)[0] + ".250"

    def lookup(name: str, server: str = SLIRP_DNS, *over: str) -> list[object]:
        # The loop serves the resolver: the lookup runs beside it.
        argv = ["python3", "-c", DNS_PROBE, name, server, *over]
        done = oci_session.run(asyncio.to_thread(m.agent.exec, argv, timeout_ms=30_000))
        assert done.ok, done.stderr
        return list(json.loads(done.stdout))

    def reach() -> str:
        [(result, _)] = oci_session.run(asyncio.to_thread(probe_inside, m, [testhost]))
        return str(result)

    resolv_file = run_dir / m.id / slirpdns.RESOLV_FILE
    address = slirpdns.address_in(resolv_file.read_text()) if gvisor else None
    assert (address is not None) == gvisor  # runc's slirp4netns asks the host's resolver
    if gvisor:
        # Open (no policy yet): podbay's resolver forwards every name, over
        # UDP and TCP.
        assert lookup("other.test") == [0, [other]]
        assert lookup("other.test", SLIRP_DNS, "tcp") == [0, [other]]

    oci_session.run(
        network.set_egress(m.id, EgressPolicy.parse({"allow": ["allowed.test", "*.wild.test"]}))
    )
    # No allowed name gave the test host's address yet: the literal is refused.
    assert reach() in refused
    assert lookup("other.test")[0] == REFUSED_RCODE
    assert lookup("wild.test")[0] == REFUSED_RCODE  # "*." is under it, not it
    assert lookup("allowed.test") == [0, [testnet.testhost_address]]
    assert reach() == "connected:testhost\n"
    assert lookup("sub.wild.test") == [0, [testnet.testhost_address]]
    if gvisor:  # runc's resolver on lo is UDP only
        assert lookup("other.test", SLIRP_DNS, "tcp")[0] == REFUSED_RCODE
        assert lookup("allowed.test", SLIRP_DNS, "tcp") == [0, [testnet.testhost_address]]
    # The sandbox's own libc, through its resolv.conf (10.0.2.3).
    done = oci_session.run(
        asyncio.to_thread(m.sh, "getent ahostsv4 sub.wild.test | head -n1", timeout_ms=30_000)
    )
    assert done.stdout.split()[:1] == [testnet.testhost_address]
    # Another resolver answers nothing, even on an address an allowed name gave.
    assert lookup("other.test", dnsmasq)[0] == "error"
    assert lookup("other.test", dnsmasq, "tcp")[0] == "error"

    # A live change: a deny list of names under an open default.
    oci_session.run(network.set_egress(m.id, EgressPolicy.parse({"deny": ["other.test"]})))
    assert lookup("other.test")[0] == REFUSED_RCODE
    assert lookup("allowed.test") == [0, [testnet.testhost_address]]
    if gvisor:
        # And back to open: runc's lookups go to the host's resolver again, which
        # knows no *.test; gVisor's still to podbay's, which forwards them all.
        oci_session.run(network.set_egress(m.id, EgressPolicy()))
        assert lookup("other.test") == [0, [other]]

    # The node restarts: its resolvers stop with it, and lookups fail (closed)
    # until it adopts the machine and serves them again.
    oci_session.run(network.set_egress(m.id, EgressPolicy.parse({"allow": ["allowed.test"]})))
    watching = network._watch is not None

    async def restart() -> None:
        assert await network.adopt(m.id) is not None
        if watching:
            network.watch_addresses()  # the driver's prepare, in a new node

    oci_session.run(network.close())
    try:
        assert lookup("allowed.test")[0] == "error"
        assert lookup("other.test")[0] == "error"
    finally:
        oci_session.run(restart())
    if gvisor:
        assert slirpdns.address_in(resolv_file.read_text()) == address  # the same one
    assert lookup("other.test")[0] == REFUSED_RCODE
    assert lookup("allowed.test") == [0, [testnet.testhost_address]]
    assert reach() == "connected:testhost\n"

    # Destroyed: its resolver's address is free again.
    oci_session.run(oci_session.driver.destroy(m.id))
    if address is not None:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as free:
            free.bind((address, 53))


def test_domain_rules_hold_after_a_killed_node_is_adopted(
    oci_machines: Machines, oci_session: DriverSession, testnet: NetLab, dnsmasq: str
) -> None:
    """A node process starts a sandbox with names in its policy and is killed
    with SIGKILL: its resolver dies with it, so the sandbox's lookups fail
    (closed, never through to the host's resolver); this node's adopt serves
    them again, the policy's way (gVisor: at the same host-loopback address,
    which its slirp4netns, still running, asks)."""
    driver, network = oci_session.driver, oci_session.driver.network
    network.dns_upstream = dnsmasq
    policy = EgressPolicy.parse({"allow": ["allowed.test"]})
    spec = dataclasses.replace(small_spec(), egress=policy)
    oci_machines.ids.append(spec.machine_id)
    node_killed_once_ready(
        "podbay.runtime.oci.driver:OciDriver", oci_session.settings, {"running": spec}
    )
    m = Machine(spec.machine_id, oci_session)
    testhost = ("tcp", testnet.testhost_address, testnet.testhost_port, "")

    def lookup(name: str) -> list[object]:
        argv = ["python3", "-c", DNS_PROBE, name, SLIRP_DNS]
        done = oci_session.run(asyncio.to_thread(m.agent.exec, argv, timeout_ms=30_000))
        assert done.ok, done.stderr
        return list(json.loads(done.stdout))

    assert lookup("allowed.test")[0] == "error"
    assert lookup("other.test")[0] == "error"
    observed = {o.machine_id: o.state for o in oci_session.run(driver.adopt())}
    assert observed[spec.machine_id] == MachineState.RUNNING
    assert lookup("other.test")[0] == REFUSED_RCODE
    assert lookup("allowed.test") == [0, [testnet.testhost_address]]
    [(result, _)] = oci_session.run(asyncio.to_thread(probe_inside, m, [testhost]))
    assert result == "connected:testhost\n"


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
    meet the redirect to the name check in the sandbox's namespace; gVisor's
    leave as sockets of its slirp4netns, which a redirect in the host's
    namespace (matched by that slirp4netns's cgroup) sends to the check. In
    both a TLS ClientHello or an HTTP request naming denied.test is cut, one
    naming allowed.test passes, live."""
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
    assert results[0] == "tls:allowed.test", results
    assert results[1] in CUT, results
    assert results[2] == "http:allowed.test", results
    assert results[3] in CUT, results
    check = network._checks[m.id]
    assert check.cut == 2, (check.cut, check.passed)
    if not gvisor:
        # Straight to the check (it listens on the sandbox's own 127.0.0.1): no
        # relay. (gVisor's listens on the host's 127.0.0.1, which slirp's
        # gateway does not lead to, --disable-host-loopback, and tap0's rules
        # drop 10.0.0.0/8 before it: test_real_sandbox_network.)
        [straight] = named_inside(m, oci_session, [("tls", "127.0.0.1", check.port, "x")])
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


#: In a sandbox: argv[1] is [address, port, n]; n connections closed at once,
#: then n that read the server's first bytes; prints the failures.
CUT_THEN_BANNERS = r"""
import json, socket, sys
host, port, n = json.loads(sys.argv[1])
failures = []
for i in range(n):
    try:
        with socket.create_connection((host, port), timeout=10):
            pass
    except OSError as e:
        failures.append(f"closed {i}: {e!r}")
for i in range(n):
    try:
        with socket.create_connection((host, port), timeout=10) as s:
            if not s.recv(64):
                failures.append(f"banner {i}: nothing")
    except OSError as e:
        failures.append(f"banner {i}: {e!r}")
print(json.dumps(failures))
"""


def _host_table(table: str) -> str | None:
    """``nft list table ip <table>`` in the host's namespace (None: not there)."""
    done = subprocess.run(
        ["nft", "list", "table", "ip", table], capture_output=True, text=True, check=False
    )
    return done.stdout if done.returncode == 0 else None


def _named_on_host(targets: list[tuple[str, str, int, str]]) -> list[str]:
    """NAMED_PROBE from the host's namespace (outside any sandbox's cgroup)."""
    done = subprocess.run(
        ["python3", "-c", NAMED_PROBE, json.dumps(targets)],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return list(json.loads(done.stdout))


def test_gvisor_names_are_checked_on_the_host_across_a_restart(
    oci_machines: Machines,
    oci_session: DriverSession,
    testnet: NetLab,
    dnsmasq: str,
    named: NamedServers,
) -> None:
    """gVisor's check lives in the host's namespace: its slirp4netns is in a v2
    cgroup of its own, and only that cgroup's TCP is redirected (the host's
    own connection to the same server is not). While the node is down its
    connections are refused (closed, not unchecked); adopt serves them again;
    a policy without names and teardown take the redirect (and the cgroup) away."""
    if Path(oci_session.settings.runtime.oci_runtime).name != "runsc":
        pytest.skip("the host-side check is gVisor's (runc's: the test above)")
    network = oci_session.driver.network
    network.dns_upstream = dnsmasq
    m = oci_machines.up()
    host = testnet.testhost_address
    denied = [("tls", host, TLS_PORT, "denied.test")]
    allowed = [("tls", host, TLS_PORT, "allowed.test")]
    oci_session.run(network.set_egress(m.id, EgressPolicy.parse({"deny": ["denied.test"]})))
    table = slirp_names_table(m.id)
    listed = _host_table(table)
    assert listed is not None
    assert "cgroupv2" in listed, listed
    assert "dnat to" in listed, listed
    group = network._slirp_group(m.id)
    assert group is not None
    slirp_pid = network.slirps.recorded(network.machine_dir(m.id), network.netns_path(m.id))
    assert str(slirp_pid) in (group.directory / "cgroup.procs").read_text().split()
    # The host's own connection to the same server names denied.test and
    # passes: the redirect is that slirp4netns's only.
    assert _named_on_host(denied) == ["tls:denied.test"]
    # Straight to the check (a host process, on the sandbox's loopback
    # address): no destination but the check itself, so cut, no relay.
    check = network._checks[m.id]
    assert check.address == network._slirp_dns(m.id)
    assert check.address.startswith("127.")
    # (beside the session's loop, which serves the check)
    straight_to_check = [("http", check.address, check.port, "allowed.test")]
    [straight] = oci_session.run(asyncio.to_thread(_named_on_host, straight_to_check))
    assert straight in CUT, straight
    # Connections cut one after another (each ends before naming anything),
    # then ones whose server speaks first: every later one still meets the
    # check (its connections onward once left conntrack entries that later
    # connections of slirp4netns joined, past the redirect: reset or refused).
    burst = oci_session.run(
        asyncio.to_thread(
            m.agent.exec,
            ["python3", "-c", CUT_THEN_BANNERS, json.dumps([host, testnet.testhost_port, 50])],
            timeout_ms=120_000,
        )
    )
    assert burst.ok, burst.stderr
    assert json.loads(burst.stdout) == [], burst.stdout

    watching = network._watch is not None

    async def restart() -> None:
        assert await network.adopt(m.id) is not None
        if watching:
            network.watch_addresses()

    oci_session.run(network.close())
    try:
        # No check: the redirect leads to no socket, so nothing passes unchecked.
        [down] = named_inside(m, oci_session, allowed)
        assert down in {*CUT, "ECONNREFUSED"}, down
    finally:
        oci_session.run(restart())
    [cut, passed] = named_inside(m, oci_session, [*denied, *allowed])
    assert cut in CUT, cut
    assert passed == "tls:allowed.test", passed

    # A policy without names: the host's table goes, names pass unchecked.
    oci_session.run(network.set_egress(m.id, EgressPolicy.parse({"deny": ["192.0.2.0/24"]})))
    assert _host_table(table) is None
    assert named_inside(m, oci_session, denied) == ["tls:denied.test"]
    oci_session.run(network.set_egress(m.id, EgressPolicy.parse({"deny": ["denied.test"]})))
    assert _host_table(table) is not None
    # Destroyed: the table and the cgroup go with it.
    oci_session.run(oci_session.driver.destroy(m.id))
    assert _host_table(table) is None
    assert not group.directory.exists()
