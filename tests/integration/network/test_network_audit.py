"""The egress audit of one sandbox network, driven from inside its namespace
the way a runc container's kernel stack sends (``inet podbay_audit``); real
sandboxes of every class are in test_network_audit_sandbox.py."""

from __future__ import annotations

import asyncio
import os
import select
import signal
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


#: What gVisor's netstack does: an Ethernet frame written to tap0 through a
#: packet socket, which no inet hook sees (only tap0's egress hook does).
RAW_FRAME = """
import socket, struct, sys
address, port = sys.argv[1], int(sys.argv[2])
def checksum(data):
    total = sum(struct.unpack("!%dH" % (len(data) // 2), data))
    total = (total >> 16) + (total & 0xFFFF)
    return ~(total + (total >> 16)) & 0xFFFF
udp = struct.pack("!HHHH", 40000, port, 13, 0) + b"frame"
ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), 1, 0, 64, 17, 0,
                 socket.inet_aton("10.0.2.100"), socket.inet_aton(address))
ip = ip[:10] + struct.pack("!H", checksum(ip)) + ip[12:]
s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
s.bind(("tap0", 0))
try:
    s.send(b"\\xff" * 6 + b"\\x02\\x00\\x00\\x00\\x00\\x01" + b"\\x08\\x00" + ip + udp)
except OSError:
    pass  # ENOBUFS: dropped at tap0's egress hook (a refusal)
"""


def send_frame(netns: Path, address: str, port: int) -> None:
    done = in_netns(netns, PROBE_PYTHON, "-I", "-c", RAW_FRAME, address, str(port), sandbox=False)
    assert done.returncode == 0, done.stderr


def test_frames_on_tap0_are_audited_also_after_slirp_restarted(
    audited: NetworkManager, runner: asyncio.Runner, testnet: NetLab
) -> None:
    """A user-space stack's frames (gVisor's) meet ``netdev podbay_audit_tap``;
    when slirp4netns died and ``adopt`` started a new one (a new tap0), the
    audit's chains hold on the new device and its sets kept their counts."""
    handle = runner.run(audited.setup("sbx"))
    blocked = "10.0.0.1"  # private: refused by the platform at tap0 too
    send_frame(handle.netns_path, testnet.testhost_address, 9001)
    send_frame(handle.netns_path, blocked, 9001)
    rows = runner.run(audited.audit("sbx"))
    assert _row(rows, testnet.testhost_address, 9001, "reached").packets == 1
    assert _row(rows, blocked, 9001, "refused").packets == 1
    assert handle.slirp_pid is not None
    pidfd = os.pidfd_open(handle.slirp_pid)
    try:
        os.kill(handle.slirp_pid, signal.SIGKILL)
        # Readable once it has exited (its tap0 gone with it).
        assert select.select([pidfd], [], [], 30)[0]
    finally:
        os.close(pidfd)
    again = runner.run(audited.adopt("sbx"))
    assert again is not None
    assert again.slirp_pid != handle.slirp_pid
    send_frame(handle.netns_path, testnet.testhost_address, 9002)
    send_frame(handle.netns_path, blocked, 9002)
    rows = runner.run(audited.audit("sbx"))
    assert _row(rows, testnet.testhost_address, 9001, "reached").packets == 1
    assert _row(rows, testnet.testhost_address, 9002, "reached").packets == 1
    assert _row(rows, blocked, 9002, "refused").packets == 1
