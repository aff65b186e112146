"""The egress audit of one sandbox network, driven from inside its namespace
the way a runc container's kernel stack sends (``inet podbay_audit``); real
sandboxes of every class are in test_network_audit_sandbox.py."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from _nethelpers import PROBE_PYTHON, NetLab, in_netns, probe
from test_network_egress import REFUSED, lookup, serving, to_testhost

from podbay.domain.egress import EgressPolicy
from podbay.runtime.network import NetworkManager
from podbay.runtime.network.audit import SIZE, Destination


@pytest.fixture
def audited(run_dir: Path, runner: asyncio.Runner, dnsmasq: str) -> Iterator[NetworkManager]:
    m = NetworkManager(run_dir, True, dns_upstream=dnsmasq)
    yield m
    for machine_id in m.machines():
        runner.run(m.teardown(machine_id))


def _row(rows: list[Destination], address: str, port: int, verdict: str) -> Destination:
    found = [r for r in rows if (r.address, r.port, r.verdict) == (address, port, verdict)]
    assert len(found) == 1, rows
    return found[0]


def test_reached_and_refused_destinations_are_audited_with_their_names(
    audited: NetworkManager, runner: asyncio.Runner, testnet: NetLab
) -> None:
    policy = EgressPolicy.parse({"allow": ["allowed.test"]})
    netns = runner.run(audited.setup("sbx", egress=policy)).netns_path
    assert serving(runner, lookup, netns, "allowed.test") == [0, [testnet.testhost_address]]
    other = testnet.testhost_address.rsplit(".", 1)[0] + ".250"
    results = serving(runner, probe, netns, [to_testhost(testnet), ("tcp", other, 81, "")])
    assert results[0][0] == "connected:testhost\n"
    assert results[1][0] in REFUSED
    rows = runner.run(audited.audit("sbx"))
    reached = _row(rows, testnet.testhost_address, testnet.testhost_port, "reached")
    assert (reached.protocol, reached.name) == ("tcp", "allowed.test")
    assert reached.bytes > 0
    refused = _row(rows, other, 81, "refused")
    assert refused.name is None
    assert refused.packets >= 1
    # A policy change swaps the policy's tables, never the audit's.
    runner.run(audited.set_egress("sbx", EgressPolicy.parse({"internet": False})))
    runner.run(audited.refresh("sbx"))
    after = runner.run(audited.audit("sbx"))
    assert _row(after, testnet.testhost_address, testnet.testhost_port, "reached").packets >= (
        reached.packets
    )
    [(result, _)] = serving(runner, probe, netns, [to_testhost(testnet)])
    assert result in REFUSED
    rows = runner.run(audited.audit("sbx"))
    assert _row(rows, testnet.testhost_address, testnet.testhost_port, "refused").packets >= 1
    # Adoption (a node restart) keeps the audit and loads its rules once.
    runner.run(audited.adopt("sbx"))
    adopted = runner.run(audited.audit("sbx"))
    assert _row(adopted, other, 81, "refused").packets == refused.packets
    runner.run(audited.teardown("sbx"))
    assert runner.run(audited.audit("sbx")) == []


FLOOD = """
import socket, sys
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
address, first, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
refused = 0
for port in range(first, first + count):
    try:
        s.sendto(b"x", (address, port))
    except OSError:
        refused += 1
print(refused)
"""


def test_a_full_audit_records_no_more_and_refuses_as_before(
    audited: NetworkManager, runner: asyncio.Runner, testnet: NetLab
) -> None:
    """A sandbox that tries more destinations than the audit holds fills it:
    later refused ones go unrecorded, while what it reaches still is (the
    reached set has its own room), and the policy refuses and allows exactly
    as before (the audit's rules carry no verdict)."""
    other = testnet.testhost_address.rsplit(".", 1)[0] + ".250"
    policy = EgressPolicy.parse({"allow": [testnet.testhost_address]})
    netns = runner.run(audited.setup("sbx", egress=policy)).netns_path
    done = in_netns(netns, PROBE_PYTHON, "-I", "-c", FLOOD, other, "1024", str(SIZE + 100))
    assert done.returncode == 0, done.stderr
    rows = runner.run(audited.audit("sbx"))
    assert len(rows) == SIZE
    assert {r.verdict for r in rows} == {"refused"}
    results = probe(netns, [("tcp", other, 81, ""), to_testhost(testnet)])
    assert results[0][0] in REFUSED
    assert results[1][0] == "connected:testhost\n"
    after = runner.run(audited.audit("sbx"))
    assert not [r for r in after if r.port == 81]
    [reached] = [r for r in after if r.verdict == "reached"]
    assert reached.address == testnet.testhost_address
    assert len(after) == SIZE + 1
