"""The SNI and Host check of a sandbox whose policy names domains, seen from
inside its namespace (the way a runc container's kernel stack sends).

allowed.test and denied.test both resolve to the test host (dnsmasq), whose
HTTPS and HTTP servers answer with the name a connection gave them
(``_namedservers``): a connection is cut or passed on its name alone.
Real sandboxes of each class: test_network_sandbox.py, test_network_vm.py.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from _namedservers import ECHO_PORT, ECHO_PROBE, HTTP_PORT, NAMED_PROBE, TLS_PORT, NamedServers
from _nethelpers import PROBE_PYTHON, NetLab, in_netns, probe, sh
from test_network_egress import lookup, serving
from test_network_isolation import _counters

from podbay.domain.egress import EgressPolicy
from podbay.runtime.network import NetworkManager, namecheck
from podbay.runtime.network.policy import NAMES_TABLE
from podbay.runtime.network.policy import budgets as policy_budgets

#: How a cut connection looks from inside: a reset (or, had the client's read
#: begun after it, a plain end).
CUT = {"ECONNRESET", "closed", "ssl:UNEXPECTED_EOF_WHILE_READING", "EPIPE"}


def named_probe(netns: Path, targets: list[tuple[str, str, int, str]]) -> list[str]:
    done = in_netns(netns, PROBE_PYTHON, "-I", "-c", NAMED_PROBE, json.dumps(targets))
    assert done.returncode == 0, done.stderr
    return list(json.loads(done.stdout))


@pytest.fixture
def resolving(run_dir: Path, runner: asyncio.Runner, dnsmasq: str) -> Iterator[NetworkManager]:
    m = NetworkManager(run_dir, True, dns_upstream=dnsmasq)
    yield m
    for machine_id in m.machines():
        runner.run(m.teardown(machine_id))


def tls(net: NetLab, name: str) -> tuple[str, str, int, str]:
    return ("tls", net.testhost_address, TLS_PORT, name)


def http(net: NetLab, name: str) -> tuple[str, str, int, str]:
    return ("http", net.testhost_address, HTTP_PORT, name)


def test_a_denied_name_is_cut_on_an_address_an_allowed_name_opened(
    resolving: NetworkManager, runner: asyncio.Runner, testnet: NetLab, named: NamedServers
) -> None:
    policy = EgressPolicy.parse({"allow": ["allowed.test", "*.wild.test"], "deny": ["denied.test"]})
    netns = runner.run(resolving.setup("sbx", egress=policy)).netns_path
    assert serving(runner, lookup, netns, "allowed.test") == [0, [testnet.testhost_address]]
    before = list(named.answered)
    results = serving(
        runner,
        named_probe,
        netns,
        [
            tls(testnet, "allowed.test"),
            tls(testnet, "denied.test"),
            tls(testnet, "unlisted.test"),  # under an allow list, not allowed
            tls(testnet, "a.wild.test"),
            tls(testnet, ""),  # no SNI: judged on its address, which is allowed
            http(testnet, "allowed.test"),
            http(testnet, "denied.test"),
            http(testnet, "Denied.Test.:8081"),
            http(testnet, "unlisted.test"),
            http(testnet, ""),
            ("raw", testnet.testhost_address, testnet.testhost_port, ""),  # server speaks first
        ],
    )
    assert results[0] == "tls:allowed.test", results
    assert results[1] in CUT, results
    assert results[2] in CUT, results
    assert results[3] == "tls:a.wild.test", results
    assert results[4] == "tls:", results
    assert results[5] == "http:allowed.test", results
    assert {results[6], results[7], results[8]} <= CUT, results
    assert results[9] == "http:", results
    assert results[10] == "testhost", results
    # What was cut never reached a server: only the passed ones answered.
    answered = named.answered[len(before) :]
    assert sorted(answered) == sorted(
        ["tls:allowed.test", "tls:a.wild.test", "tls:", "http:allowed.test", "http:"]
    )
    check = resolving._checks["sbx"]
    assert check.cut == 5


def test_a_deny_list_of_names_cuts_them_under_an_open_default(
    resolving: NetworkManager, runner: asyncio.Runner, testnet: NetLab, named: NamedServers
) -> None:
    policy = EgressPolicy.parse({"deny": ["denied.test"]})
    netns = runner.run(resolving.setup("sbx", egress=policy)).netns_path
    results = serving(
        runner,
        named_probe,
        netns,
        [
            tls(testnet, "denied.test"),
            tls(testnet, "allowed.test"),
            tls(testnet, "unlisted.test"),
            http(testnet, "DENIED.test"),
            http(testnet, "unlisted.test"),
        ],
    )
    assert results[0] in CUT, results
    assert results[1:3] == ["tls:allowed.test", "tls:unlisted.test"], results
    assert results[3] in CUT, results
    assert results[4] == "http:unlisted.test", results
    # QUIC would carry its name where the check cannot read it: refused, so
    # HTTP/3 clients fall back to TCP; other UDP stays open.
    quic, other = serving(
        runner,
        probe,
        netns,
        [
            ("udp", testnet.testhost_address, 443, "00"),
            ("udp", testnet.testhost_address, 4443, "00"),
        ],
    )
    assert quic[0] in {"EPERM", "ECONNREFUSED"}, quic
    assert other[0] == "ECONNREFUSED", other  # the test host's own answer: no server
    assert _counters(netns)["quic"] == 1


def test_a_connection_straight_to_the_check_is_refused(
    resolving: NetworkManager, runner: asyncio.Runner, testnet: NetLab, named: NamedServers
) -> None:
    """The check listens on the namespace's 127.0.0.1, which the sandbox reaches:
    a connection there has no destination but the check itself, so it relays
    nothing (no open relay, whatever name it gives)."""
    netns = runner.run(
        resolving.setup("sbx", egress=EgressPolicy.parse({"deny": ["denied.test"]}))
    ).netns_path
    check = resolving._checks["sbx"]
    request = f"GET http://{testnet.testhost_address}:{HTTP_PORT}/ HTTP/1.1\r\nHost: allowed.test"
    results = serving(
        runner,
        named_probe,
        netns,
        [
            ("raw", "127.0.0.1", check.port, (request + "\r\n\r\n").encode().hex()),
            ("tls", "127.0.0.1", check.port, "allowed.test"),
        ],
    )
    assert all(result in CUT | {"ssl:UNEXPECTED_EOF_WHILE_READING"} for result in results), results
    assert check.cut == 2
    assert check.passed == 0


def test_hostile_first_bytes_are_cut(
    resolving: NetworkManager,
    runner: asyncio.Runner,
    testnet: NetLab,
    named: NamedServers,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A ClientHello that does not parse, a request head that never ends (a
    trickling client), a client that sends nothing, more connections than the
    check takes: each is cut, and the check goes on serving."""
    monkeypatch.setattr(namecheck, "NAME_TIMEOUT", 0.5)
    monkeypatch.setattr(namecheck, "IDLE_TIMEOUT", 1.0)
    netns = runner.run(
        resolving.setup("sbx", egress=EgressPolicy.parse({"deny": ["denied.test"]}))
    ).netns_path
    handshake = bytes([0x16, 3, 1, 0, 9, 1, 0, 0, 5, 3, 3, 0, 0, 0])  # a body cut short
    huge = bytes([0x16, 3, 1, 0x40, 0x01])  # a record over 16 KiB
    results = serving(
        runner,
        named_probe,
        netns,
        [
            ("raw", testnet.testhost_address, TLS_PORT, handshake.hex()),
            ("raw", testnet.testhost_address, TLS_PORT, huge.hex()),
            ("raw", testnet.testhost_address, HTTP_PORT, b"GET / HTTP/1.1\r\nHo".hex()),
            ("raw", testnet.testhost_address, HTTP_PORT, b"G".hex()),
            http(testnet, "bad name!"),
            # Nothing sent, to a server that waits for a request: ended.
            ("raw", testnet.testhost_address, HTTP_PORT, ""),
        ],
    )
    assert all(result in CUT for result in results), results
    assert resolving._checks["sbx"].cut == len(results)
    # Connections past the cap are cut; those within it still work.
    monkeypatch.setattr(namecheck, "MAX_CONNECTIONS", 3)
    holding = (
        "import socket, sys\n"
        f"held = [socket.create_connection(('{testnet.testhost_address}', {HTTP_PORT})) "
        "for _ in range(3)]\n"
        f"s = socket.create_connection(('{testnet.testhost_address}', {HTTP_PORT}))\n"
        "s.settimeout(15)\n"
        "try:\n    print(repr(s.recv(10)))\nexcept OSError as e:\n    print(type(e).__name__)\n"
    )
    done = serving(runner, in_netns, netns, PROBE_PYTHON, "-I", "-c", holding)
    assert done.stdout.strip() in {"ConnectionResetError", "b''"}, done
    [result] = serving(runner, named_probe, netns, [tls(testnet, "allowed.test")])
    assert result == "tls:allowed.test"


def test_a_policy_change_applies_live(
    resolving: NetworkManager, runner: asyncio.Runner, testnet: NetLab, named: NamedServers
) -> None:
    netns = runner.run(resolving.setup("sbx")).netns_path
    denied = tls(testnet, "denied.test")
    assert serving(runner, named_probe, netns, [denied]) == ["tls:denied.test"]
    runner.run(resolving.set_egress("sbx", EgressPolicy.parse({"deny": ["denied.test"]})))
    [result] = serving(runner, named_probe, netns, [denied])
    assert result in CUT
    # Another list of names: the same check, the new policy.
    runner.run(resolving.set_egress("sbx", EgressPolicy.parse({"deny": ["allowed.test"]})))
    results = serving(runner, named_probe, netns, [denied, tls(testnet, "allowed.test")])
    assert results[0] == "tls:denied.test", results
    assert results[1] in CUT, results
    # A reload of the rules and an adoption keep it.
    runner.run(resolving.refresh("sbx"))
    assert runner.run(resolving.adopt("sbx")) is not None
    [result] = serving(runner, named_probe, netns, [tls(testnet, "allowed.test")])
    assert result in CUT
    # No names any more: no check, no redirect.
    runner.run(resolving.set_egress("sbx", EgressPolicy.parse({"deny": ["192.0.2.0/24"]})))
    assert "sbx" not in resolving._checks
    assert NAMES_TABLE not in sh("nsenter", f"--net={netns}", "--", "nft", "list", "tables")
    assert serving(runner, named_probe, netns, [denied]) == ["tls:denied.test"]


def test_a_check_that_died_with_the_node_refuses_until_adopted(
    resolving: NetworkManager,
    runner: asyncio.Runner,
    testnet: NetLab,
    named: NamedServers,
    dnsmasq: str,
    run_dir: Path,
) -> None:
    """The redirect outlives the node process; its check does not. Meanwhile
    connections are refused (closed, not open), and a new node's adopt serves
    them again."""
    netns = runner.run(
        resolving.setup("sbx", egress=EgressPolicy.parse({"deny": ["denied.test"]}))
    ).netns_path
    runner.run(resolving.close())
    [result] = named_probe(netns, [tls(testnet, "allowed.test")])
    assert result == "ECONNREFUSED"
    again = NetworkManager(run_dir, True, dns_upstream=dnsmasq)
    assert runner.run(again.adopt("sbx")) is not None
    try:
        results = serving(
            runner, named_probe, netns, [tls(testnet, "allowed.test"), tls(testnet, "denied.test")]
        )
        assert results[0] == "tls:allowed.test", results
        assert results[1] in CUT, results
    finally:
        runner.run(again.close())


def test_a_checked_connection_spends_one_new_connection_of_the_budget(
    run_dir: Path, runner: asyncio.Runner, testnet: NetLab, named: NamedServers, dnsmasq: str
) -> None:
    """The sandbox's connection is counted as it leaves for its real
    destination; the check's own connection onward is not counted again."""
    manager = NetworkManager(
        run_dir, True, dns_upstream=dnsmasq, budgets=policy_budgets(0, 1)
    )  # burst: 5
    try:
        netns = runner.run(
            manager.setup("sbx", egress=EgressPolicy.parse({"deny": ["denied.test"]}))
        ).netns_path
        results = serving(runner, named_probe, netns, [tls(testnet, "allowed.test")] * 5)
        assert results == ["tls:allowed.test"] * 5
    finally:
        runner.run(manager.teardown("sbx"))


def test_a_passed_connection_carries_every_byte_both_ways(
    resolving: NetworkManager, runner: asyncio.Runner, testnet: NetLab, named: NamedServers
) -> None:
    """Relayed both ways at once (the echo server writes while the client still
    sends), and ended in order: the client's end reaches the server, whose
    end reaches the client."""
    netns = runner.run(
        resolving.setup("sbx", egress=EgressPolicy.parse({"deny": ["denied.test"]}))
    ).netns_path
    done = serving(
        runner, in_netns, netns, PROBE_PYTHON, "-I", "-c", ECHO_PROBE,
        testnet.testhost_address, str(ECHO_PORT), "48",
    )  # fmt: skip
    assert done.stdout.strip() == "same", done
    assert resolving._checks["sbx"].passed == 1
