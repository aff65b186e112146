"""The operator's budgets (``runtime.egress_bandwidth_mbit``,
``runtime.egress_new_connections_per_second``): measured at a test host.

The bandwidth is measured where it arrives (the test host's own receiver,
first byte to end of stream), for the namespace's kernel stack (a runc
container's, and QEMU's sockets for a vm guest) and for real runc, gVisor
and vm sandboxes. The cap is low enough that this 2-core machine is not the
bottleneck: without it the same sender is clearly faster.
"""

from __future__ import annotations

import asyncio
import json
import os
import select
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from _nethelpers import PROBE_PYTHON, NetLab, in_netns, stop
from test_network_isolation import _counters
from test_network_sandbox import oci_session as oci_session  # the fixture, used here too

from podbay.domain.egress import EgressPolicy
from podbay.runtime.agent_client import AgentClient
from podbay.runtime.network import NetworkManager
from podbay.runtime.network.policy import Budgets
from podbay.settings import Settings
from podbay.testing.fixtures import OCI_RUNTIMES, Machines, settings_for, small_spec
from podbay.testing.vm import VmSession

# Rates are measured: nothing else runs beside them (./run test).
pytestmark = pytest.mark.alone

CAP_MBIT = 40
#: New connections per second (a burst of 5 on top: Budgets.connection_burst).
RATE = 10
SINK_PORT = 9009
SECONDS = 2.0

#: The test host's receiver: one line per TCP connection that sent anything,
#: "<bytes> <seconds from its first byte to its end>"; on UDP, "udp <count>"
#: of the datagrams before each "report".
SINK = r"""
import socket, sys, threading, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", int(sys.argv[1]))); s.listen(256)
u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); u.bind(("0.0.0.0", int(sys.argv[1])))
def count():
    n = 0
    while True:
        data, _ = u.recvfrom(100)
        if data == b"report":
            print("udp", n, flush=True)
            n = 0
        else:
            n += 1
threading.Thread(target=count, daemon=True).start()
print("ready", flush=True)
def serve(c):
    n, t0 = 0, None
    while True:
        b = c.recv(1 << 20)
        if not b:
            break
        t0 = t0 or time.monotonic()
        n += len(b)
    c.close()
    if n:
        print(n, time.monotonic() - t0, flush=True)
while True:
    c, _ = s.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
"""

#: Runs in the sandbox. ``send HOST PORT SECONDS``: one connection writing as
#: fast as it can. ``connect HOST PORT N WAIT``: N connections started at once;
#: how many are up, refused, or unanswered after WAIT seconds (under 1 s: before
#: a dropped SYN is sent again, which would spend the budget twice). ``udp HOST
#: PORT N``: a second on, a datagram from each of N sockets (N flows), then
#: "report" on the first flow; prints how many sends failed at once.
CLIENT = r"""
import errno, json, select, socket, sys, time
host, port = sys.argv[2], int(sys.argv[3])
if sys.argv[1] == "send":
    c = socket.create_connection((host, port), timeout=10)
    buf, end = b"x" * 65536, time.monotonic() + float(sys.argv[4])
    while time.monotonic() < end:
        c.sendall(buf)
    c.close()
    sys.exit()
if sys.argv[1] == "udp":
    # What the connections before took comes back with time alone (the budget
    # refills at its rate): the first flow, which carries the report, passes.
    time.sleep(1)
    flows = [socket.socket(socket.AF_INET, socket.SOCK_DGRAM) for _ in range(int(sys.argv[4]))]
    failed = 0
    for u in flows:
        try:
            u.sendto(b"x", (host, port))
        except OSError:
            failed += 1
    # The report waits until the helpers (gVisor's netstack, QEMU) have sent or
    # refused every datagram above, which they do from queues of their own:
    # sent at once it overtook some, which then arrived (or were refused)
    # after the count it closes; and a second refills the budget, so the
    # report passes even on a flow whose first datagram was refused (new
    # again at tap0, which remembers only the flows it let through).
    time.sleep(1)
    flows[0].sendto(b"report", (host, port))
    print(json.dumps({"failed": failed}))
    sys.exit()
socks = []
for _ in range(int(sys.argv[4])):
    s = socket.socket(); s.setblocking(False)
    s.connect_ex((host, port)); socks.append(s)
end = time.monotonic() + float(sys.argv[5])
pending, result = set(socks), {"connected": 0, "refused": 0, "unanswered": 0}
while pending and time.monotonic() < end:
    _, ready, _ = select.select([], list(pending), [], max(0, end - time.monotonic()))
    for s in ready:
        pending.discard(s)
        err = s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        result["connected" if err == 0 else "refused"] += 1
result["unanswered"] = len(pending)
print(json.dumps(result))
"""


class Sink:
    def __init__(self, testnet: NetLab) -> None:
        self.address = testnet.testhost_address
        self.proc = subprocess.Popen(
            ["nsenter", f"--net={testnet.testhost_netns}", "--", PROBE_PYTHON, "-I", "-c",
             SINK, str(SINK_PORT)],
            stdout=subprocess.PIPE,
            text=True,
        )  # fmt: skip
        assert self.next_line() == "ready"

    def next_line(self) -> str:
        assert self.proc.stdout is not None
        ready, _, _ = select.select([self.proc.stdout], [], [], 60)
        assert ready, "the test host's receiver said nothing for 60 s"
        return self.proc.stdout.readline().strip()

    def mbit(self) -> float:
        """What the next connection to end delivered, in Mbit/s."""
        received, seconds = self.next_line().split()
        return int(received) * 8 / float(seconds) / 1e6


@pytest.fixture(scope="module")
def sink(testnet: NetLab) -> Iterator[Sink]:
    made = Sink(testnet)
    yield made
    stop(made.proc)  # type: ignore[arg-type]
    assert made.proc.stdout is not None
    made.proc.stdout.close()


def within_cap(mbit: float) -> bool:
    return 0.8 * CAP_MBIT <= mbit <= 1.2 * CAP_MBIT


# ------------------------------------------------------------------ the kernel stack


def send_from(netns: Path, sink: Sink) -> float:
    done = in_netns(
        netns, PROBE_PYTHON, "-I", "-c", CLIENT, "send", sink.address, str(SINK_PORT), str(SECONDS)
    )
    assert done.returncode == 0, done.stderr
    return sink.mbit()


def test_the_kernel_stack_is_held_to_the_bandwidth_cap(
    run_dir: Path, runner: asyncio.Runner, sink: Sink
) -> None:
    # What runc's sockets and a vm's QEMU (its guest's connections are QEMU's
    # sockets in the namespace) send: the same path through tap0.
    capped = NetworkManager(run_dir / "capped", True, budgets=Budgets(bandwidth_mbit=CAP_MBIT))
    free = NetworkManager(run_dir / "free", True)
    try:
        handle = runner.run(capped.setup("sbx"))
        held = send_from(handle.netns_path, sink)
        unheld = send_from(runner.run(free.setup("sbx")).netns_path, sink)
        # A live policy change leaves the cap; slirp4netns dying takes tap0 and
        # its queue along, and adopt's new one gets the cap again.
        other = EgressPolicy.parse({"deny": ["198.51.100.0/24"]})
        runner.run(capped.set_egress("sbx", other))
        assert handle.slirp_pid is not None
        gone = os.pidfd_open(handle.slirp_pid)
        try:
            os.kill(handle.slirp_pid, signal.SIGKILL)
            assert select.select([gone], [], [], 10)[0], "slirp4netns outlived SIGKILL"
        finally:
            os.close(gone)
        adopted = runner.run(capped.adopt("sbx"))
        assert adopted is not None
        assert adopted.slirp_pid != handle.slirp_pid
        held_again = send_from(handle.netns_path, sink)
    finally:
        runner.run(capped.teardown("sbx"))
        runner.run(free.teardown("sbx"))
    print(
        f"kernel stack: {held:.1f} Mbit/s capped at {CAP_MBIT}, {unheld:.1f} without, "
        f"{held_again:.1f} after a policy change and a new slirp4netns"
    )
    assert within_cap(held), held
    assert unheld > 1.5 * CAP_MBIT, unheld
    assert within_cap(held_again), held_again


def test_new_connections_over_the_rate_are_refused_at_once(
    run_dir: Path, runner: asyncio.Runner, sink: Sink
) -> None:
    manager = NetworkManager(
        run_dir / "capped", True, budgets=Budgets(new_connections_per_second=RATE)
    )
    try:
        netns = runner.run(manager.setup("sbx")).netns_path
        argv = ["connect", sink.address, str(SINK_PORT), "40", "0.8"]
        done = in_netns(netns, PROBE_PYTHON, "-I", "-c", CLIENT, *argv)
        assert done.returncode == 0, done.stderr
        result = json.loads(done.stdout)
        print(f"kernel stack: 40 new connections at once: {result}")
        # The burst (5) and what the rate refilled while they started (~0.1 s).
        assert 5 <= result["connected"] <= 5 + RATE, result
        assert result["refused"] == 40 - result["connected"], result  # a reset, not a timeout
        assert _counters(netns)["connection-rate"] == result["refused"]
        # Without the budget all 40 get through (the test host takes them).
        free = NetworkManager(run_dir / "free", True)
        try:
            unlimited = in_netns(
                runner.run(free.setup("sbx")).netns_path,
                *(PROBE_PYTHON, "-I", "-c", CLIENT, *argv),
            )
        finally:
            runner.run(free.teardown("sbx"))
        assert json.loads(unlimited.stdout)["connected"] == 40, unlimited
        # A new policy, swapped in live, keeps the budget (a fresh bucket, the
        # same rule), as does a reload.
        other = EgressPolicy.parse({"deny": ["198.51.100.0/24"]})
        runner.run(manager.set_egress("sbx", other))
        runner.run(manager.refresh("sbx"))
        done = in_netns(netns, PROBE_PYTHON, "-I", "-c", CLIENT, *argv)
        assert done.returncode == 0, done.stderr
        again = json.loads(done.stdout)
        assert 5 <= again["connected"] <= 5 + RATE, again
        assert again["refused"] == 40 - again["connected"], again
    finally:
        runner.run(manager.teardown("sbx"))


# ------------------------------------------------------------------ real sandboxes


@pytest.fixture(scope="module", params=OCI_RUNTIMES)
def oci_settings(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Settings]:
    yield from settings_for(
        tmp_path_factory,
        request.param,
        egress_bandwidth_mbit=CAP_MBIT,
        egress_new_connections_per_second=RATE,
    )


def client_in(agent: AgentClient, *argv: str) -> str:
    done = agent.exec(["python3", "-c", CLIENT, *argv], timeout_ms=60_000)
    assert done.ok, done.stderr
    return done.stdout


def held_to_budgets(agent: AgentClient, netns: Path, sink: Sink, name: str) -> None:
    """What every class shows: the bandwidth at the cap (and clearly more with
    it taken off ``tap0``), new connections over the rate refused (dropped at
    ``tap0`` for gVisor, whose packets no ``inet`` hook sees)."""
    send = ("send", sink.address, str(SINK_PORT), str(SECONDS))
    client_in(agent, *send)
    held = sink.mbit()
    off = in_netns(netns, "tc", "qdisc", "del", "dev", "tap0", "root", sandbox=False)
    assert off.returncode == 0, off.stderr
    client_in(agent, *send)
    unheld = sink.mbit()
    print(f"{name}: {held:.1f} Mbit/s capped at {CAP_MBIT}, {unheld:.1f} without")
    assert within_cap(held), held
    # An emulated (TCG) guest on two loaded cores sends only 65-130 Mbit/s
    # itself: for it "clearly more" is clear of the cap's tolerance.
    assert unheld > (1.25 if name == "vm" else 1.5) * CAP_MBIT, unheld

    result = json.loads(client_in(agent, "connect", sink.address, str(SINK_PORT), "40", "0.8"))
    print(f"{name}: 40 new connections at once: {result}")
    assert 5 <= result["connected"] <= 5 + RATE, result
    over = 40 - result["connected"]
    if name == "gvisor":
        # tap0's hook can only drop: the attempts over the rate go unanswered.
        # Not every one is a SYN dropped there: with the machine busy, the
        # netstack had sent only 17 of its 35 when the window closed (all 35
        # when it was not), and the others never left.
        assert result["unanswered"] == over, result
        dropped = _counters(netns, "netdev podbay_tap")["connection-rate"]
        # A SYN the netstack sent again before the window closed is dropped
        # (and counted) again: at most one retransmission each in 0.8 s.
        assert 0 < dropped <= 2 * over, (dropped, result)
    else:
        assert result["refused"] == over, result
        assert _counters(netns)["connection-rate"] == over

    # UDP flows spend the same budget; a flow's later datagrams (the report)
    # none, though no answer ever comes back.
    table = "netdev podbay_tap" if name == "gvisor" else "inet podbay"
    before = _counters(netns, table).get("flow-rate", 0)
    failed = json.loads(client_in(agent, "udp", sink.address, str(SINK_PORT), "40"))["failed"]
    kind, arrived = sink.next_line().split()
    refused = _counters(netns, table)["flow-rate"] - before
    print(f"{name}: 40 new UDP flows at once: {arrived} arrived, {refused} refused")
    assert kind == "udp"
    assert int(arrived) <= 5 + RATE, arrived
    if name == "gvisor":
        # Its netstack sends each flow's datagram from a queue of its own (the
        # report may overtake them) and was still sending when the counters
        # were read: dropped ones counted, none past the rate arrived.
        assert 0 < refused <= 40 - int(arrived), (refused, arrived)
    else:
        assert int(arrived) >= 5, arrived
        assert refused == 40 - int(arrived), (refused, arrived)
        # The refusal meets the sending socket: the container's own; a vm
        # guest's datagram is lost behind QEMU's (whose send failed).
        assert failed == (0 if name == "vm" else refused), failed


def test_a_sandbox_is_held_to_its_budgets(
    oci_machines: Machines, oci_settings: Settings, sink: Sink
) -> None:
    gvisor = Path(oci_settings.runtime.oci_runtime).name == "runsc"
    machine = oci_machines.up()
    netns = oci_machines.session.driver.network.netns_path(machine.id)
    held_to_budgets(machine.agent, netns, sink, "gvisor" if gvisor else "container")


def test_a_vm_guest_is_held_to_its_budgets(
    tmp_path_factory: pytest.TempPathFactory, sink: Sink
) -> None:
    # Its connections are QEMU's sockets in the namespace: the kernel stack's path.
    session = VmSession.open(
        tmp_path_factory.mktemp("podbay-vm-budgets"),
        egress_bandwidth_mbit=CAP_MBIT,
        egress_new_connections_per_second=RATE,
    )
    try:
        machine_id = session.up(small_spec(memory_bytes=256 << 20, disk_bytes=256 << 20))
        agent = AgentClient(session.driver.agent_socket(machine_id))
        held_to_budgets(agent, session.driver.network.netns_path(machine_id), sink, "vm")
    finally:
        session.close()
