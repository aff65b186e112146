"""The egress audit of real sandboxes: runc (its kernel stack meets ``inet
podbay_audit``) and runsc (gVisor's netstack writes to tap0 and meets ``netdev
podbay_audit_tap``), through the driver; the vm class is in test_network_vm.py,
the API and the CLI in test_network_egress_api.py."""

from __future__ import annotations

import asyncio
from pathlib import Path

from _nethelpers import NetLab
from test_network_sandbox import oci_session as oci_session  # the fixtures, per runtime
from test_network_sandbox import oci_settings as oci_settings
from test_network_sandbox import probe_inside

from podbay.domain.egress import EgressDestination, EgressPolicy
from podbay.runtime.network import netns, nft
from podbay.runtime.network.audit import Counted, parse_sets
from podbay.testing.fixtures import (
    DriverSession,
    Machines,
)


def listing(path: Path) -> dict[str, dict[str, dict[tuple[str, str, int], Counted]]]:
    """Both audit tables' sets, read in the namespace (this thread enters it)."""
    netns.enter(path)
    return {
        "inet": parse_sets(nft.query("list table inet podbay_audit")),
        "netdev": parse_sets(nft.query("list table netdev podbay_audit_tap")),
    }


def one(rows: list[EgressDestination], address: str, port: int, verdict: str) -> EgressDestination:
    found = [r for r in rows if (r.address, r.port, r.verdict) == (address, port, verdict)]
    assert len(found) == 1, rows
    return found[0]


def test_a_real_sandbox_audits_what_it_reached_and_was_refused(
    oci_machines: Machines, oci_session: DriverSession, testnet: NetLab, dnsmasq: str
) -> None:
    """Both resolve through podbay's resolver (runc on the namespace's ``lo``,
    gVisor through slirp's forwarder), so the reached destination has the
    allowed name; the refused one, reached by address, has none."""
    gvisor = Path(oci_session.settings.runtime.oci_runtime).name == "runsc"
    driver = oci_session.driver
    driver.network.dns_upstream = dnsmasq
    m = oci_machines.up()
    other = testnet.testhost_address.rsplit(".", 1)[0] + ".250"
    testhost = ("tcp", testnet.testhost_address, testnet.testhost_port, "")
    policy = EgressPolicy.parse({"allow": ["allowed.test"]})
    oci_session.run(driver.set_egress(m.id, policy))
    # The loop serves the resolver: the lookup runs beside it.
    done = oci_session.run(
        asyncio.to_thread(m.sh, "getent ahostsv4 allowed.test | head -n1", timeout_ms=30_000)
    )
    assert done.stdout.split()[0] == testnet.testhost_address, done
    results = oci_session.run(
        asyncio.to_thread(probe_inside, m, [testhost, ("tcp", other, 81, "")])
    )
    assert results[0][0] == "connected:testhost\n", results
    assert results[1][0] in {"ECONNREFUSED", "timeout"}
    rows = oci_session.run(driver.egress_audit(m.id))
    reached = one(rows, testnet.testhost_address, testnet.testhost_port, "reached")
    assert reached.protocol == "tcp"
    assert reached.bytes > 0
    assert reached.name == "allowed.test"
    refused = one(rows, other, 81, "refused")
    assert refused.protocol == "tcp"
    assert refused.packets >= 1
    assert refused.name is None
    # Counted once: gVisor's frames only at tap0, runc's packets only in inet
    # (marked there, skipped at tap0).
    key = (testnet.testhost_address, "tcp", testnet.testhost_port)
    path = driver.network.netns_path(m.id)

    async def read() -> dict[str, dict[str, dict[tuple[str, str, int], Counted]]]:
        return await netns.in_fresh_thread(lambda: listing(path))

    listed = oci_session.run(read())
    counted_at = {table for table, sets in listed.items() if key in sets.get("reached_v4", {})}
    assert counted_at == {"netdev" if gvisor else "inet"}
    # Stopped, the machine has no network and no audit.
    oci_session.run(driver.stop(m.id))
    assert oci_session.run(driver.egress_audit(m.id)) == []
