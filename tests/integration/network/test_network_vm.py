"""A ``vm`` guest's packets obey its namespace's policy (QEMU runs inside it),
and its host processes (QEMU, its slirp4netns) stay within host budgets.

One TCG guest for the module: it reaches the test host (a public-looking
address in a namespace of this session), and none of the host's addresses,
its loopback (through either gateway) or the metadata and private ranges.
Its ``runtime.slirp_max_fds`` is lowered to 256 (as in
tests/security/test_network_slirp_limits.py), so a few hundred connections
from the guest exhaust the budget.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from _namedservers import HTTP_PORT, NAMED_PROBE, TLS_PORT, NamedServers
from _nethelpers import PROBE_PYTHON, NetLab, in_netns, restrictive_policies, stop

from podbay.domain.egress import EgressPolicy
from podbay.runtime.agent_client import AgentClient
from podbay.runtime.network.decoy import Decoy
from podbay.runtime.network.policy import SLIRP_GATEWAY
from podbay.runtime.probes import BYPASSES, egress_bypasses
from podbay.runtime.vm.budget import QEMU_OVERHEAD_MIB, QEMU_OWN_FDS
from podbay.runtime.vm.qemu import GUEST_GATEWAY
from podbay.testing.fixtures import small_spec
from podbay.testing.flood import HOLDING_SERVER, flood
from podbay.testing.upstream import own_slot
from podbay.testing.vm import VmSession

# The flood test measures a cap against an emulated guest's connect timeouts:
# beside another module's load its guest could not release the flood in time.
pytestmark = pytest.mark.alone

MAX_FDS = 256
GUEST_MIB = 256
HOLDING_PORT = 8090
V2_FILES = {"memory": "memory.max", "pids": "pids.max", "cpu": "cpu.max"}
V1_FILES = {"memory": "memory.limit_in_bytes", "pids": "pids.max", "cpu": "cpu.cfs_quota_us"}


@dataclass
class Booted:
    session: VmSession
    machine_id: str

    @property
    def qemu(self) -> int:
        pid = self.session.driver.qemu_pid(self.machine_id)
        assert pid is not None
        return pid

    @property
    def slirp(self) -> int:
        pid_file = self.session.driver.network.machine_dir(self.machine_id) / "slirp.pid"
        return int(pid_file.read_text().split()[0])


@pytest.fixture(scope="module")
def booted(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Booted]:
    session = VmSession.open(tmp_path_factory.mktemp("podbay-vm-net"), slirp_max_fds=MAX_FDS)
    try:
        spec = small_spec(memory_bytes=GUEST_MIB << 20, disk_bytes=256 << 20)
        yield Booted(session, session.up(spec))
    finally:
        session.close()


@pytest.fixture(scope="module")
def guest(booted: Booted) -> AgentClient:
    return AgentClient(booted.session.driver.agent_socket(booted.machine_id))


def connect(agent: AgentClient, host: str, port: int) -> str:
    """What a TCP connect from inside the guest gets: the first line, or the error."""
    result = agent.exec(
        ["timeout", "5", "bash", "-c", f"exec 3<>/dev/tcp/{host}/{port} && head -n1 <&3"],
        timeout_ms=20_000,
    )
    return result.stdout.strip() if result.exit_code == 0 else f"failed: {result.stderr}"


def test_guest_reaches_the_test_host(guest: AgentClient, testnet: NetLab) -> None:
    assert connect(guest, testnet.testhost_address, testnet.testhost_port) == "testhost"


def test_an_address_the_host_gains_after_the_guest_started_is_refused(
    booted: Booted, guest: AgentClient
) -> None:
    """The vm driver watches the host's addresses as the OCI one does: QEMU's
    sockets meet the namespace's rules, reloaded when the host gains one."""
    link = f"pbvw{os.getpid()}"
    address = f"198.51.100.{150 + own_slot(50)}"
    netns = booted.session.driver.network.netns_path(booted.machine_id)

    def blocked() -> bool:
        listed = in_netns(netns, "nft", "-j", "list", "set", "inet", "podbay", "blocked_v4",
                          sandbox=False)  # fmt: skip
        return address in listed.stdout

    assert not blocked()
    subprocess.run(["ip", "link", "add", link, "type", "veth", "peer", "name", f"{link}p"],
                   check=True)  # fmt: skip
    try:
        subprocess.run(["ip", "addr", "add", f"{address}/32", "dev", link], check=True)
        for name in (link, f"{link}p"):
            subprocess.run(["ip", "link", "set", name, "up"], check=True)
        with socket.create_server((address, 0)) as server:
            deadline = time.monotonic() + 10
            while not blocked():
                assert time.monotonic() < deadline, "the running guest's rules went stale"
                # The driver lives on this loop (as in the server): let it run.
                booted.session.run(asyncio.sleep(0.1))
            got = connect(guest, address, server.getsockname()[1])
            assert got.startswith("failed"), got
    finally:
        subprocess.run(["ip", "link", "del", link], capture_output=True, check=False)


def test_guest_reaches_no_host_address(guest: AgentClient, testnet: NetLab) -> None:
    before = {a: s.accepted for a, s in testnet.servers.items()}
    for address, server in testnet.servers.items():
        if ":" in address:
            continue
        assert connect(guest, address, server.port).startswith("failed"), address
    loopback = testnet.servers["127.0.0.1"].port
    for gateway in (SLIRP_GATEWAY, GUEST_GATEWAY):
        assert connect(guest, gateway, loopback).startswith("failed"), gateway
    assert {a: s.accepted for a, s in testnet.servers.items()} == before


def test_the_guest_obeys_its_egress_policy_live(booted: Booted, testnet: NetLab) -> None:
    """QEMU's user networking sends from the namespace's kernel stack: the
    sandbox's policy in ``inet podbay`` holds the guest, changed while it runs."""
    guest = AgentClient(booted.session.driver.agent_socket(booted.machine_id))
    driver = booted.session.driver
    deny = EgressPolicy.parse({"deny": [testnet.testhost_address]})
    try:
        booted.session.run(driver.set_egress(booted.machine_id, deny))
        assert connect(guest, testnet.testhost_address, testnet.testhost_port).startswith("failed")
        allow = EgressPolicy.parse({"allow": [testnet.testhost_address]})
        booted.session.run(driver.set_egress(booted.machine_id, allow))
        assert connect(guest, testnet.testhost_address, testnet.testhost_port) == "testhost"
        booted.session.run(driver.set_egress(booted.machine_id, EgressPolicy(internet=False)))
        assert connect(guest, testnet.testhost_address, testnet.testhost_port).startswith("failed")
    finally:
        booted.session.run(driver.set_egress(booted.machine_id, EgressPolicy()))
    assert connect(guest, testnet.testhost_address, testnet.testhost_port) == "testhost"


def test_the_guest_resolves_only_allowed_names(
    booted: Booted, testnet: NetLab, dnsmasq: str
) -> None:
    """QEMU forwards the guest's lookups to 10.0.2.3 from the namespace's kernel:
    they reach podbay's resolver on its lo, which answers allowed names only."""
    guest = AgentClient(booted.session.driver.agent_socket(booted.machine_id))
    driver = booted.session.driver
    driver.network.dns_upstream = dnsmasq
    session = booted.session

    def resolve(name: str) -> str:
        # In a thread while the session's loop runs: that loop serves the resolver.
        done = session.run(
            asyncio.to_thread(
                guest.exec, ["sh", "-c", f"getent ahostsv4 {name} | head -n1"], timeout_ms=30_000
            )
        )
        return done.stdout.split()[0] if done.stdout.strip() else ""

    try:
        policy = EgressPolicy.parse({"allow": ["allowed.test"]})
        session.run(driver.set_egress(booted.machine_id, policy))
        assert resolve("other.test") == ""
        assert connect(guest, testnet.testhost_address, testnet.testhost_port).startswith("failed")
        assert resolve("allowed.test") == testnet.testhost_address
        reached = session.run(
            asyncio.to_thread(connect, guest, testnet.testhost_address, testnet.testhost_port)
        )
        assert reached == "testhost"
    finally:
        session.run(driver.set_egress(booted.machine_id, EgressPolicy()))


def test_the_guests_egress_is_audited_with_names(
    booted: Booted, testnet: NetLab, dnsmasq: str
) -> None:
    """QEMU's sockets are the namespace's kernel stack: ``inet podbay_audit``
    counts them, and the names come from podbay's resolver, which QEMU's
    forwarding of the guest's lookups meets."""
    guest = AgentClient(booted.session.driver.agent_socket(booted.machine_id))
    driver = booted.session.driver
    driver.network.dns_upstream = dnsmasq
    session = booted.session
    other = testnet.testhost_address.rsplit(".", 1)[0] + ".250"
    try:
        session.run(
            driver.set_egress(booted.machine_id, EgressPolicy.parse({"allow": ["allowed.test"]}))
        )
        looked_up = session.run(
            asyncio.to_thread(
                guest.exec,
                ["sh", "-c", "getent ahostsv4 allowed.test | head -n1"],
                timeout_ms=30_000,
            )
        )
        assert looked_up.stdout.split()[0] == testnet.testhost_address
        reached = session.run(
            asyncio.to_thread(connect, guest, testnet.testhost_address, testnet.testhost_port)
        )
        assert reached == "testhost"
        assert connect(guest, other, 81).startswith("failed")
        rows = session.run(driver.egress_audit(booted.machine_id))
        by_key = {(r.address, r.port, r.verdict): r for r in rows}
        hit = by_key[(testnet.testhost_address, testnet.testhost_port, "reached")]
        assert (hit.protocol, hit.name) == ("tcp", "allowed.test")
        assert hit.bytes > 0
        miss = by_key[(other, 81, "refused")]
        assert miss.packets >= 1
        assert miss.name is None
    finally:
        session.run(driver.set_egress(booted.machine_id, EgressPolicy()))


def cgroups_of(pid: int) -> dict[str, str]:
    """Each controller's cgroup path of a process (``""``: the unified hierarchy)."""
    paths = {}
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(","):
            paths[controller] = path.strip("/")
    return paths


def limits(pid: int) -> dict[str, str]:
    """The cgroup a process is in (its memory controller's path) and its limits:
    memory bytes, pids, CPU quota per 100 ms period."""
    paths = cgroups_of(pid)
    root = Path("/sys/fs/cgroup")
    if (root / "cgroup.controllers").exists():
        files = {n: root / paths[""] / f for n, f in V2_FILES.items()}
    else:
        files = {n: root / n / paths[n] / f for n, f in V1_FILES.items()}
    found = {n: file.read_text().split()[0] for n, file in files.items()}
    return {"cgroup": paths["memory" if "memory" in paths else ""], **found}


def max_open_files(pid: int) -> int:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            return int(line.split()[3])
    raise AssertionError("no open files limit")


def test_qemu_and_its_slirp4netns_have_host_budgets(booted: Booted) -> None:
    driver = booted.session.driver
    qemu = limits(booted.qemu)
    assert qemu["cgroup"] == driver.cgroup(booted.machine_id).strip("/"), qemu
    # The guest's RAM and QEMU's own share; its CPUs; its threads.
    assert int(qemu["memory"]) == (GUEST_MIB + QEMU_OVERHEAD_MIB) << 20, qemu
    assert qemu["cpu"] == "100000", qemu
    assert 0 < int(qemu["pids"]) < 1000, qemu
    assert max_open_files(booted.qemu) == QEMU_OWN_FDS + MAX_FDS
    slirp = limits(booted.slirp)
    assert slirp["cgroup"].endswith(f"-vm-net/{booted.machine_id}"), slirp
    assert int(slirp["memory"]) < 1 << 30, slirp
    assert slirp["pids"] != "max", slirp
    assert max_open_files(booted.slirp) == MAX_FDS


@pytest.fixture
def holding(testnet: NetLab) -> Iterator[subprocess.Popen[bytes]]:
    """A server on the test host (port ``HOLDING_PORT``) that holds every connection."""
    server = subprocess.Popen(
        ["nsenter", f"--net={testnet.testhost_netns}", "--", PROBE_PYTHON, "-I", "-c",
         HOLDING_SERVER, str(HOLDING_PORT)],
        stdout=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert server.stdout is not None
        assert server.stdout.readline() == b"ready\n"
        yield server
    finally:
        stop(server)
        if server.stdout is not None:
            server.stdout.close()


def test_a_connection_flood_from_the_guest_stops_at_the_cap(
    booted: Booted, guest: AgentClient, testnet: NetLab, holding: subprocess.Popen[bytes]
) -> None:
    qemu, slirp = booted.qemu, booted.slirp
    # Connections beyond slirp4netns's cap get no answer (its ICMP error does not
    # reach QEMU's socket), so each failure costs the guest its connect timeout:
    # a few beyond the cap are enough (without the cap they all succeed).
    attempts = MAX_FDS + 12
    done = flood(
        guest, testnet.testhost_address, HOLDING_PORT, attempts, [qemu, slirp], connect_timeout=0.5
    )
    # Neither host process held more sockets than its cap: the rest failed.
    assert done.most[slirp] <= MAX_FDS, done
    assert done.most[qemu] <= QEMU_OWN_FDS + MAX_FDS, done
    assert done.failed > 0, done
    assert done.held < attempts, done
    # Both live on, and once the far end lets the connections go (they stay
    # half-closed in the helpers until it does), the guest's network works.
    stop(holding)
    assert booted.session.driver.qemu_pid(booted.machine_id) == qemu
    assert booted.slirp == slirp
    assert Path(f"/proc/{slirp}").exists()
    # QEMU closes a flood connection's socket only once the guest's kernel
    # (emulated: slow on a busy machine) has taken the far end's FIN; until
    # then its descriptors are still at the cap and a new connect gets
    # "Network is unreachable" (slirp's answer to a socket it could not make).
    deadline = time.monotonic() + 60
    while (got := connect(guest, testnet.testhost_address, testnet.testhost_port)) != "testhost":
        assert "unreachable" in got, got
        assert time.monotonic() < deadline, got
        time.sleep(0.5)


def test_adopt_puts_qemu_back_under_its_budget(booted: Booted) -> None:
    """QEMU outlives the node, and one started without a budget (by an older
    node) gets it when adopted: here it is moved out to the root first."""
    driver = booted.session.driver
    root = Path("/sys/fs/cgroup")
    hierarchies = [root] if driver.cgroups.version == 2 else [root / c for c in V1_FILES]
    for hierarchy in hierarchies:
        (hierarchy / "cgroup.procs").write_text(str(booted.qemu))
    moved = cgroups_of(booted.qemu)
    assert moved.get("memory", moved[""]) == ""
    booted.session.run(driver.adopt())
    assert limits(booted.qemu)["cgroup"] == driver.cgroup(booted.machine_id).strip("/")
    assert int(limits(booted.qemu)["memory"]) == (GUEST_MIB + QEMU_OVERHEAD_MIB) << 20


def test_no_policy_that_is_not_open_lets_a_guests_bypass_through(
    booted: Booted, guest: AgentClient, decoy: Decoy
) -> None:
    """The guest's kernel sends what it likes (GRE, SCTP, raw ICMP): QEMU's
    user networking carries TCP, UDP and ICMP echo only, and each of those
    meets the policy in ``inet podbay`` as QEMU's own sockets. After the flood
    test: the flows it leaves in slirp4netns until they expire (a few
    descriptors) should not count against that test's cap."""
    driver, w = booted.session.driver, decoy.witness
    try:
        for label, policy in restrictive_policies(decoy).items():
            booted.session.run(driver.set_egress(booted.machine_id, policy))
            # Beside the driver's loop, which serves the name check meanwhile.
            outcome = booted.session.run(
                asyncio.to_thread(
                    egress_bypasses, guest, decoy.allowed, decoy.refused, decoy.ipv6, w.counts,
                    w.reset,
                )
            )  # fmt: skip
            assert outcome.reached == dict.fromkeys(BYPASSES), (label, outcome)
            if policy.internet:
                assert outcome.control == "connected", (label, outcome)
        # Without the rules (an open policy) the same probe sees them through.
        booted.session.run(driver.set_egress(booted.machine_id, EgressPolicy()))
        outcome = egress_bypasses(
            guest, decoy.allowed, decoy.refused, decoy.ipv6, w.counts, w.reset
        )
        through = {name for name, what in outcome.reached.items() if what}
        assert through == {"direct", "dns_udp", "dns_tcp", "dot", "icmp"}, outcome
    finally:
        booted.session.run(driver.set_egress(booted.machine_id, EgressPolicy()))


#: A cut connection, seen from inside the guest (behind QEMU's libslirp, a
#: reset reaches the guest as a reset or an end).
CUT = {"ECONNRESET", "closed", "ssl:UNEXPECTED_EOF_WHILE_READING", "EPIPE"}


def test_the_guest_meets_the_name_check(
    booted: Booted, testnet: NetLab, dnsmasq: str, named: NamedServers
) -> None:
    """QEMU opens the guest's connections from the namespace's kernel stack:
    they meet the redirect to the name check, so a ClientHello or a request
    naming denied.test is cut on the address allowed.test (the same) passes
    on; through QEMU's gateway (the namespace's 127.0.0.1) the check itself
    relays nothing.

    After the flood test and the adoption (so also a check a new node
    process serves): run before the flood, the flood's last connection
    failed (ENETUNREACH from QEMU) in most runs, for a reason not found yet.
    libslirp holds the sockets of the connections cut here for a few seconds
    (in QEMU and in its slirp4netns): the test ends once they are let go."""
    guest = AgentClient(booted.session.driver.agent_socket(booted.machine_id))
    driver = booted.session.driver
    driver.network.dns_upstream = dnsmasq
    session = booted.session
    host = testnet.testhost_address

    def named_probe(targets: list[tuple[str, str, int, str]]) -> list[str]:
        done = session.run(
            asyncio.to_thread(
                guest.exec,
                ["python3", "-c", NAMED_PROBE, json.dumps(targets)],
                timeout_ms=90_000,
            )
        )
        assert done.exit_code == 0, done.stderr
        return list(json.loads(done.stdout))

    held = (sockets(booted.qemu), sockets(booted.slirp))
    try:
        session.run(
            driver.set_egress(booted.machine_id, EgressPolicy.parse({"deny": ["denied.test"]}))
        )
        check = driver.network._checks[booted.machine_id]
        port = check.port
        before = len(named.answered)
        results = named_probe(
            [
                ("tls", host, TLS_PORT, "allowed.test"),
                ("tls", host, TLS_PORT, "denied.test"),
                ("http", host, HTTP_PORT, "allowed.test"),
                ("http", host, HTTP_PORT, "denied.test"),
                ("tls", GUEST_GATEWAY, port, "allowed.test"),
            ]
        )
        assert results[0] == "tls:allowed.test", results
        assert results[2] == "http:allowed.test", results
        assert {results[1], results[3]} <= CUT, results
        # Through the gateway: cut by the check. Its reset may come while
        # libslirp still completes the guest's handshake: then the guest's
        # connect is refused instead. Never relayed.
        assert results[4] in CUT | {"ECONNREFUSED"}, (results, check.cut)
        assert sorted(named.answered[before:]) == ["http:allowed.test", "tls:allowed.test"]
        # Live: a policy without names takes the check away.
        session.run(
            driver.set_egress(booted.machine_id, EgressPolicy.parse({"deny": ["192.0.2.0/24"]}))
        )
        assert named_probe([("tls", host, TLS_PORT, "denied.test")]) == ["tls:denied.test"]
    finally:
        session.run(driver.set_egress(booted.machine_id, EgressPolicy()))
    deadline = time.monotonic() + 60
    while sockets(booted.qemu) > held[0] or sockets(booted.slirp) > held[1]:
        assert time.monotonic() < deadline, (held, sockets(booted.qemu), sockets(booted.slirp))
        time.sleep(0.5)


def sockets(pid: int) -> int:
    """The sockets a process holds."""
    count = 0
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            count += os.readlink(fd).startswith("socket:")
    return count


def test_destroy_leaves_no_cgroup(booted: Booted) -> None:
    """Last in the module: it destroys the module's guest."""
    driver = booted.session.driver
    slirp = driver.network.slirps
    made = [driver.cgroup(booted.machine_id), slirp.cgroup(booted.machine_id)]
    assert all(driver.cgroups.existing(path) for path in made), made
    booted.session.run(driver.destroy(booted.machine_id))
    assert not any(driver.cgroups.existing(path) for path in made), made
