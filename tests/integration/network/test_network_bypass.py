"""Bypasses of an egress policy, tried from real runc and gVisor sandboxes
against the decoy (``podbay doctor``'s): DNS to another resolver over UDP and
TCP, DNS over TLS/QUIC, a direct connection, ICMP echo, GRE/SCTP/UDP-Lite.
Every policy that is not open refuses them all; an open one lets through what
the platform itself carries, which shows the probe sees a bypass."""

from __future__ import annotations

import asyncio
import io
import subprocess
import sys
import tempfile
import typing
from pathlib import Path

from _nethelpers import restrictive_policies
from test_network_sandbox import oci_session as oci_session  # the fixtures, per runtime
from test_network_sandbox import oci_settings as oci_settings

from podbay.cli.commands.doctor import Report, egress_bypass_probes
from podbay.cli.output import Output
from podbay.domain.egress import EgressPolicy
from podbay.runtime.base import Driver
from podbay.runtime.network.decoy import LINK_PREFIX, WORKDIR_PREFIX, Decoy, remove_stale
from podbay.runtime.probes import BYPASSES, egress_bypasses
from podbay.testing.fixtures import (
    DriverSession,
    Machines,
)


def test_no_policy_that_is_not_open_lets_a_bypass_through(
    oci_machines: Machines, oci_session: DriverSession, decoy: Decoy
) -> None:
    m = oci_machines.up()
    network = oci_session.driver.network
    w = decoy.witness
    for label, policy in restrictive_policies(decoy).items():
        oci_session.run(network.set_egress(m.id, policy))
        # Beside the driver's loop, which serves the policy's resolver and
        # name check while the probes run (as a node's always does).
        outcome = oci_session.run(
            asyncio.to_thread(
                egress_bypasses,
                m.agent,
                decoy.allowed,
                decoy.refused,
                decoy.ipv6,
                w.counts,
                w.reset,
            )
        )
        assert outcome.reached == dict.fromkeys(BYPASSES), (label, outcome)
        # The allowed address still answers (the policy is not merely closed).
        if policy.internet:
            assert outcome.control == "connected", (label, outcome)


def test_an_open_policy_shows_the_probe_sees_a_bypass(
    oci_machines: Machines, oci_session: DriverSession, decoy: Decoy
) -> None:
    """Without the rules (an open policy) the same probe reports what reached
    the decoy: DNS anywhere, DNS over TLS, a direct connection; gVisor's ping
    too (slirp4netns sends it on). A container cannot ping at all (no
    CAP_NET_RAW, and its namespace's ping_group_range lets no group use ping
    sockets), and no user-mode network helper carries GRE, SCTP or UDP-Lite."""
    gvisor = Path(oci_session.settings.runtime.oci_runtime).name == "runsc"
    m = oci_machines.up()
    oci_session.run(oci_session.driver.network.set_egress(m.id, EgressPolicy()))
    w = decoy.witness
    outcome = egress_bypasses(m.agent, decoy.allowed, decoy.refused, decoy.ipv6, w.counts, w.reset)
    through = {name for name, what in outcome.reached.items() if what}
    expected = {"direct", "dns_udp", "dns_tcp", "dot"} | ({"icmp"} if gvisor else set())
    assert through == expected, outcome


class RulesNeverLoad:
    """A driver whose ``set_egress`` does nothing: the sandbox stays open, as
    if the policy's rules were missing."""

    async def set_egress(self, machine_id: str, egress: EgressPolicy) -> None:
        return None


def test_the_doctor_reports_each_bypass_when_the_rules_are_missing(
    oci_machines: Machines, oci_session: DriverSession
) -> None:
    """``podbay doctor``'s own probe (its decoy, its lines) FAILs what gets
    through: DNS, DoT and the direct connection, and gVisor's ping."""
    gvisor = Path(oci_session.settings.runtime.oci_runtime).name == "runsc"
    m = oci_machines.up()
    report = Report(Output(as_json=True, out=io.StringIO()))
    driver = typing.cast(Driver, RulesNeverLoad())
    oci_session.run(egress_bypass_probes(driver, m.id, m.agent, report))
    failed = {c.name.removeprefix("egress policy holds: ") for c in report.checks if not c.ok}
    expected = {"direct", "dns_udp", "dns_tcp", "dot"} | ({"icmp"} if gvisor else set())
    assert failed == {BYPASSES[name] for name in expected}, report.checks
    assert report.checks[0].name == "egress policy probes reach their decoy where allowed"
    assert report.checks[0].ok, report.checks[0]


def test_a_killed_doctors_decoy_is_removed_by_the_next() -> None:
    """A doctor killed mid-run leaves its decoy (link, namespace mount,
    directory); the next decoy removes it first."""
    script = (
        "import sys\nfrom podbay.runtime.network.decoy import decoy_host\n"
        "with decoy_host() as d:\n    print(d.allowed, flush=True)\n    sys.stdin.read()\n"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert holder.stdout is not None
    assert holder.stdin is not None
    assert holder.stdout.readline().strip()
    link = f"{LINK_PREFIX}{holder.pid}x"
    left = list(Path(tempfile.gettempdir()).glob(f"{WORKDIR_PREFIX}{holder.pid}-*"))
    assert left
    holder.kill()
    holder.wait(timeout=10)
    holder.stdin.close()
    holder.stdout.close()
    assert link in subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    remove_stale()
    assert link not in subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert not any(path.exists() for path in left)
    with open("/proc/self/mountinfo") as f:
        assert str(left[0]) not in f.read()
