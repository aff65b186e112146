"""Per-user kernel counters: one sandbox exhausting its own leaves a neighbour
and the host working.

The attack: inotify instances, POSIX message queue bytes and pending
real-time signals are counted per user *and* per owner of the user namespace.
With every sandbox's namespace owned by host root, one sandbox holding all
128 inotify instances (or all mqueue bytes, or all queued RT signals) made
``inotify_init`` fail in another tenant's sandbox and for root on the host.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import time

import pytest

from podbay.runtime.agent_client import AgentClient
from podbay.testing.fixtures import Machines

pytestmark = [pytest.mark.root, pytest.mark.timeout(240)]

#: Holds as many of each counter as the kernel gives, then reports and sleeps.
EXHAUST = r"""
import ctypes, os, signal, sys, time
libc = ctypes.CDLL(None, use_errno=True)
held = []
while libc.inotify_init1(0) >= 0:
    held.append(1)
inotify = len(held)
queues = 0
while True:
    try:
        open("/dev/mqueue/q%d" % queues, "x").close()
    except OSError:
        break
    queues += 1
signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGRTMIN])
signals = 0
# sigqueue, not kill: a kill() past the limit is delivered without its data
# instead of refused.
while libc.sigqueue(os.getpid(), signal.SIGRTMIN, None) == 0:
    signals += 1
with open("/tmp/exhausted", "w") as f:
    f.write("%d %d %d" % (inotify, queues, signals))
time.sleep(600)
"""

#: Each counter once, inside a sandbox or on the host: "inotify mqueue rtsignal" outcomes.
PROBE = r"""
import ctypes, os, signal, sys
libc = ctypes.CDLL(None, use_errno=True)
out = []
fd = libc.inotify_init1(0)
out.append("ok" if fd >= 0 else os.strerror(ctypes.get_errno()))
name = b"/podbay-probe-%d" % os.getpid()
mq = libc.mq_open(name, os.O_CREAT | os.O_RDWR, 0o600, None)
out.append("ok" if mq >= 0 else os.strerror(ctypes.get_errno()))
if mq >= 0:
    libc.mq_unlink(name)
signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGRTMIN])
if libc.sigqueue(os.getpid(), signal.SIGRTMIN, None) == 0:
    out.append("ok")
else:
    out.append(os.strerror(ctypes.get_errno()))
print("|".join(out))
"""


def probe_inside(agent: AgentClient) -> list[str]:
    result = agent.exec(["python3", "-c", PROBE], timeout_ms=30_000)
    assert result.exit_code == 0, result
    return result.stdout.strip().split("|")


def probe_host() -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=30, check=True
    )
    return done.stdout.strip().split("|")


def test_one_sandbox_exhausting_its_counters_leaves_others_working(oci_machines: Machines) -> None:
    greedy, neighbour = oci_machines.up(), oci_machines.up()
    assert probe_inside(neighbour.agent) == ["ok", "ok", "ok"]
    started = greedy.agent.sh(f"python3 -c '{EXHAUST}' </dev/null >/dev/null 2>&1 &")
    assert started.ok
    deadline = time.monotonic() + 60
    while not greedy.sh("test -s /tmp/exhausted").ok:
        assert time.monotonic() < deadline, "the exhausting script never finished"
        time.sleep(0.2)
    inotify, queues, signals = map(int, greedy.sh("cat /tmp/exhausted").stdout.split())
    # It did exhaust its budget: nothing more of any counter for it.
    assert probe_inside(greedy.agent) != ["ok", "ok", "ok"]
    assert inotify > 0
    assert queues > 0
    assert signals > 0
    # Its neighbour and root on the host each still have their own.
    assert probe_inside(neighbour.agent) == ["ok", "ok", "ok"]
    assert probe_host() == ["ok", "ok", "ok"]


def test_host_probe_runs_here() -> None:
    # The host half of the check must be able to tell: it works on an idle host.
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.inotify_init1(0)
    assert fd >= 0
    os.close(fd)
