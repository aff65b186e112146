"""The egress audit of one sandbox network, driven from inside its namespace
the way a runc container's kernel stack sends (``inet podbay_audit``); real
sandboxes of every class are in test_network_audit_sandbox.py."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from _nethelpers import NetLab, probe
from test_network_egress import REFUSED, lookup, serving, to_testhost

from podbay.domain.egress import EgressPolicy
from podbay.runtime.network import NetworkManager
from podbay.runtime.network.audit import Destination


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
