"""A sandbox's own egress policy, seen from inside its network namespace.

The test host (a namespace of the test's, 203.0.113.0/24) stands in for the
internet; probes run the way a runc container does (its kernel stack meets
``inet podbay``). gVisor's path (``netdev podbay_tap``) is in
test_network_sandbox.py, with real sandboxes.
"""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest
from _nethelpers import DNS_PROBE, PROBE_PYTHON, REFUSED_RCODE, NetLab, in_netns, probe
from test_network_isolation import DNS_QUERY, _counters

from podbay.domain.egress import OPEN, EgressPolicy
from podbay.runtime.network import NetworkManager, slirpdns
from podbay.runtime.network.policy import SLIRP_DNS
from podbay.runtime.network.resolver import MAX_STREAMS

#: What a refused attempt looks like from inside (IPv6 has no route at all).
REFUSED = {"ECONNREFUSED", "EPERM", "EHOSTUNREACH", "EACCES", "ENETUNREACH"}


def policy(**doc: object) -> EgressPolicy:
    return EgressPolicy.parse(doc)


def to_testhost(net: NetLab) -> tuple[str, str, int, str]:
    return ("tcp", net.testhost_address, net.testhost_port, "")


@pytest.fixture
def sandbox(manager: NetworkManager, runner: asyncio.Runner) -> Path:
    return runner.run(manager.setup("sbx")).netns_path


def test_an_allowed_address_is_reached_and_nothing_else(
    manager: NetworkManager, runner: asyncio.Runner, testnet: NetLab
) -> None:
    allow = policy(allow=[f"{testnet.testhost_address}/32"])
    netns = runner.run(manager.setup("sbx", egress=allow)).netns_path
    other = testnet.testhost_address.rsplit(".", 1)[0] + ".250"  # not allowed, not blocked
    dns = ("udp", SLIRP_DNS, 53, DNS_QUERY)
    results = probe(netns, [to_testhost(testnet), ("tcp", other, 80, ""), dns])
    assert results[0][0] == "connected:testhost\n"
    # Refused at once, DNS included: slirp would answer any name (a tunnel out),
    # so under an allow list its forwarder is one more private address.
    assert results[1][0] in REFUSED, results
    assert results[2][0] in REFUSED, results
    counts = _counters(netns)
    assert counts["not-allowed"] >= 1
    assert counts["allowed"] >= 1
    assert "dns-udp" not in counts
    assert manager.egress("sbx") == allow


def test_deny_wins_over_allow(
    manager: NetworkManager, runner: asyncio.Runner, testnet: NetLab
) -> None:
    both = policy(allow=["203.0.113.0/24"], deny=[testnet.testhost_address])
    netns = runner.run(manager.setup("sbx", egress=both)).netns_path
    [(result, _)] = probe(netns, [to_testhost(testnet)])
    assert result == "ECONNREFUSED"
    assert _counters(netns)["denied"] >= 1


def test_no_internet_leaves_no_path_out(
    manager: NetworkManager, runner: asyncio.Runner, testnet: NetLab
) -> None:
    netns = runner.run(manager.setup("sbx", egress=policy(internet=False))).netns_path
    results = probe(
        netns,
        [
            to_testhost(testnet),
            ("udp", testnet.testhost_address, 53, DNS_QUERY),
            ("udp", SLIRP_DNS, 53, DNS_QUERY),
            ("tcp", SLIRP_DNS, 53, ""),
            ("tcp", "2001:db8::1", 80, ""),
        ],
    )
    assert all(result in REFUSED for result, _ in results), results


def test_a_change_applies_to_the_running_sandbox_and_survives_reloads(
    sandbox: Path, manager: NetworkManager, runner: asyncio.Runner, testnet: NetLab
) -> None:
    [(result, _)] = probe(sandbox, [to_testhost(testnet)])
    assert result == "connected:testhost\n"
    # set_egress returns once the new rules are in force: no waiting after it.
    runner.run(manager.set_egress("sbx", policy(deny=[f"{testnet.testhost_address}/32"])))
    [(result, _)] = probe(sandbox, [to_testhost(testnet)])
    assert result == "ECONNREFUSED"
    # A reload for the host's addresses, and an adoption after a node restart,
    # keep the policy.
    runner.run(manager.refresh("sbx"))
    runner.run(manager.refresh_all())
    assert runner.run(manager.adopt("sbx")) is not None
    [(result, _)] = probe(sandbox, [to_testhost(testnet)])
    assert result == "ECONNREFUSED"
    runner.run(manager.set_egress("sbx", OPEN))
    [(result, _)] = probe(sandbox, [to_testhost(testnet)])
    assert result == "connected:testhost\n"
    assert manager.egress("sbx") == OPEN


def test_the_platform_refusals_stay_whatever_the_policy_allows(
    manager: NetworkManager, runner: asyncio.Runner, testnet: NetLab
) -> None:
    everything = policy(allow=["0.0.0.0/0", "::/0"])
    netns = runner.run(manager.setup("sbx", egress=everything)).netns_path
    targets = [
        ("tcp", address, server.port, "")
        for address, server in testnet.servers.items()
        if ":" not in address
    ]
    before = {a: s.accepted for a, s in testnet.servers.items()}
    results = probe(netns, [to_testhost(testnet), *targets])
    assert results[0][0] == "connected:testhost\n"
    assert all(result == "ECONNREFUSED" for result, _ in results[1:]), results
    assert {a: s.accepted for a, s in testnet.servers.items()} == before


# --------------------------------------------------------------------------- domain rules

T = TypeVar("T")


def lookup(netns: Path, name: str, server: str = SLIRP_DNS) -> list[object]:
    done = in_netns(netns, PROBE_PYTHON, "-I", "-c", DNS_PROBE, name, server)
    assert done.returncode == 0, done.stderr
    return list(json.loads(done.stdout))


def serving(runner: asyncio.Runner, fn: Callable[..., T], *args: object) -> T:
    """``fn(*args)`` in a thread while the runner's loop runs: the resolvers are
    served by that loop, which stands still between ``runner.run`` calls."""
    return runner.run(asyncio.to_thread(fn, *args))


@pytest.fixture
def resolving(run_dir: Path, runner: asyncio.Runner, dnsmasq: str) -> Iterator[NetworkManager]:
    m = NetworkManager(run_dir, True, dns_upstream=dnsmasq)
    yield m
    for machine_id in m.machines():
        runner.run(m.teardown(machine_id))


def test_allowed_names_resolve_and_only_their_addresses_open(
    resolving: NetworkManager, runner: asyncio.Runner, testnet: NetLab, dnsmasq: str
) -> None:
    policy = EgressPolicy.parse({"allow": ["allowed.test", "*.wild.test"]})
    netns = runner.run(resolving.setup("sbx", egress=policy)).netns_path
    # No allowed name gave the test host's address yet: a literal address is refused.
    [(result, _)] = serving(runner, probe, netns, [to_testhost(testnet)])
    assert result == "ECONNREFUSED"
    assert serving(runner, lookup, netns, "allowed.test") == [0, [testnet.testhost_address]]
    [(result, _)] = serving(runner, probe, netns, [to_testhost(testnet)])
    assert result == "connected:testhost\n"
    assert serving(runner, lookup, netns, "sub.wild.test") == [0, [testnet.testhost_address]]
    # Names the policy does not allow are refused by podbay's resolver itself...
    assert serving(runner, lookup, netns, "other.test")[0] == REFUSED_RCODE
    # "*." is under it, not it.
    assert serving(runner, lookup, netns, "wild.test")[0] == REFUSED_RCODE
    # ... and their address stays closed; another resolver is out of reach, even
    # on an address an allowed name gave.
    other = testnet.testhost_address.rsplit(".", 1)[0] + ".250"
    [(result, _)] = serving(runner, probe, netns, [("tcp", other, 80, "")])
    assert result == "ECONNREFUSED"
    assert serving(runner, lookup, netns, "other.test", dnsmasq)[0] == "error"
    counts = _counters(netns)
    assert counts["resolved"] >= 1


def test_a_changed_policy_forgets_what_the_old_one_resolved(
    resolving: NetworkManager, runner: asyncio.Runner, testnet: NetLab
) -> None:
    netns = runner.run(
        resolving.setup("sbx", egress=EgressPolicy.parse({"allow": ["allowed.test"]}))
    ).netns_path
    assert serving(runner, lookup, netns, "allowed.test") == [0, [testnet.testhost_address]]
    runner.run(resolving.set_egress("sbx", EgressPolicy.parse({"allow": ["other.test"]})))
    [(result, _)] = serving(runner, probe, netns, [to_testhost(testnet)])
    assert result == "ECONNREFUSED"
    assert serving(runner, lookup, netns, "allowed.test")[0] == REFUSED_RCODE
    # A reload for the host's addresses keeps what the current policy resolved.
    runner.run(resolving.set_egress("sbx", EgressPolicy.parse({"allow": ["allowed.test"]})))
    assert serving(runner, lookup, netns, "allowed.test") == [0, [testnet.testhost_address]]
    runner.run(resolving.refresh("sbx"))
    [(result, _)] = serving(runner, probe, netns, [to_testhost(testnet)])
    assert result == "connected:testhost\n"
    # Back to CIDRs only: no resolver, no DNS (default-deny).
    runner.run(resolving.set_egress("sbx", EgressPolicy.parse({"allow": ["192.0.2.0/24"]})))
    assert serving(runner, lookup, netns, "allowed.test")[0] == "error"


def test_a_sandbox_with_its_own_stack_gets_a_loopback_address_of_its_own(
    resolving: NetworkManager, runner: asyncio.Runner
) -> None:
    """``own_stack`` (gVisor): the machine's slirp4netns sees, as its
    /etc/resolv.conf, an address of the host's loopback that nothing else held,
    where podbay's resolver listens until teardown."""
    first, second = slirpdns.candidates("sbx")[:2]
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as held:
        held.bind((first, 53))  # something else on the host has the first one
        handle = runner.run(resolving.setup("sbx", own_stack=True))
    recorded = resolving.machine_dir("sbx") / slirpdns.RESOLV_FILE
    assert slirpdns.address_in(recorded.read_text()) == second
    # What slirp4netns itself reads (after --enable-sandbox's pivot_root).
    seen = Path(f"/proc/{handle.slirp_pid}/root/etc/resolv.conf").read_text()
    assert slirpdns.address_in(seen) == second
    for kind in (socket.SOCK_DGRAM, socket.SOCK_STREAM):
        with socket.socket(socket.AF_INET, kind) as taken, pytest.raises(OSError, match="in use"):
            taken.bind((second, 53))
    runner.run(resolving.teardown("sbx"))
    assert not recorded.exists()
    for kind in (socket.SOCK_DGRAM, socket.SOCK_STREAM):
        with socket.socket(socket.AF_INET, kind) as free:
            free.bind((second, 53))


def test_a_host_dns_server_on_every_address_leaves_names_closed_not_the_sandbox_down(
    resolving: NetworkManager, runner: asyncio.Runner
) -> None:
    """With no host-loopback address free for its resolver (as when a DNS
    server listens on 0.0.0.0:53), a gVisor sandbox's network still comes up:
    its lookups stay with slirp's forwarder, which a policy naming domains
    refuses at ``tap0`` (closed, never open), and an open one lets through."""
    held = []
    try:
        for address in slirpdns.candidates("sbx"):
            taken = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            held.append(taken)
            taken.bind((address, 53))
        names = EgressPolicy.parse({"allow": ["allowed.test"]})
        netns = runner.run(resolving.setup("sbx", own_stack=True, egress=names)).netns_path
        assert not (resolving.machine_dir("sbx") / slirpdns.RESOLV_FILE).exists()
        tap = in_netns(netns, "nft", "list", "table", "netdev", "podbay_tap", sandbox=False)
        assert tap.returncode == 0, tap.stderr
        assert "dns-podbay" not in tap.stdout
        assert "dns-udp" not in tap.stdout
        runner.run(resolving.set_egress("sbx", OPEN))
        tap = in_netns(netns, "nft", "list", "table", "netdev", "podbay_tap", sandbox=False)
        assert "dns-udp" in tap.stdout, tap.stdout
    finally:
        for taken in held:
            taken.close()


def test_a_sandbox_holds_a_bounded_number_of_dns_connections(
    resolving: NetworkManager, runner: asyncio.Runner
) -> None:
    """A gVisor sandbox's resolver serves DNS over TCP, at most MAX_STREAMS
    connections at once: one more is closed at once, the others still answer."""
    runner.run(
        resolving.setup("sbx", own_stack=True, egress=EgressPolicy.parse({"allow": ["a.test"]}))
    )
    address = slirpdns.address_in((resolving.machine_dir("sbx") / slirpdns.RESOLV_FILE).read_text())
    assert address is not None
    query = bytes.fromhex(DNS_QUERY)  # example.com: not allowed

    def connect_all() -> list[bytes]:
        held = [socket.create_connection((address, 53), timeout=10) for _ in range(MAX_STREAMS)]
        try:
            # The resolver has taken them all once each answers a query.
            answers = []
            for conn in held:
                conn.sendall(len(query).to_bytes(2, "big") + query)
                answers.append(conn.recv(512))
            with socket.create_connection((address, 53), timeout=10) as extra:
                answers.append(extra.recv(512))  # closed at once: EOF
            return answers
        finally:
            for conn in held:
                conn.close()

    *answers, extra = serving(runner, connect_all)
    assert extra == b""
    for answer in answers:
        assert answer[5] & 15 == REFUSED_RCODE  # after the length and the id
