"""A flood of connections from inside a sandbox, watched from the host.

Every connection a sandbox opens is a host socket in its network helpers
(slirp4netns; for the ``vm`` class QEMU's libslirp as well), outside the
sandbox's own limits. The tests of their budgets open more connections than
the budget allows, to a test host that holds them, and watch the helpers'
descriptors while they are held.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from podbay.runtime.agent_client import AgentClient

#: A server (run it in the test host's namespace) that accepts every connection
#: and holds it; prints ``ready`` once listening.
HOLDING_SERVER = r"""
import resource, socket, sys
hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
s = socket.create_server(("0.0.0.0", int(sys.argv[1])), backlog=4096)
held = []
print("ready", flush=True)
while True:
    held.append(s.accept()[0])
"""

FLOOD = r"""
import resource, socket, sys, time
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
host, port, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
held, failed = [], 0
for _ in range(count):
    try:
        held.append(socket.create_connection((host, port), timeout=float(sys.argv[5])))
    except OSError:
        failed += 1
print(len(held), failed, flush=True)
time.sleep(float(sys.argv[4]))
"""


@dataclass
class Flood:
    held: int = 0
    failed: int = 0
    #: The most descriptors each watched host process had open at once.
    most: dict[int, int] = field(default_factory=dict)


def open_fds(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return 0


def flood(
    agent: AgentClient,
    host: str,
    port: int,
    count: int,
    watch: Sequence[int],
    *,
    connect_timeout: float = 2.0,
) -> Flood:
    """Open ``count`` connections from the sandbox to ``host:port`` and hold them
    2 s, so that sampling ``watch``'s descriptors (every 50 ms) sees the most
    the helpers could open; then let them go. A connection beyond a budget may
    fail only after ``connect_timeout`` (no answer rather than a refusal)."""
    out = Flood(most=dict.fromkeys(watch, 0))
    failure: list[object] = []

    def run() -> None:
        try:
            done = agent.exec(
                ["python3", "-c", FLOOD, host, str(port), str(count), "2", str(connect_timeout)],
                timeout_ms=300_000,
            )
        except Exception as e:  # noqa: BLE001 - reported in the caller's thread
            failure.append(e)
            return
        if not done.ok:
            failure.append(done)
            return
        out.held, out.failed = (int(x) for x in done.stdout.split())

    thread = threading.Thread(target=run)
    thread.start()
    while thread.is_alive():
        for pid in watch:
            out.most[pid] = max(out.most[pid], open_fds(pid))
        time.sleep(0.05)
    thread.join()
    assert not failure, failure
    return out
