"""The agent lets go of its host socket so gVisor can checkpoint the sandbox.

gVisor (runsc 20221219) refuses to save a unix socket bound on the host
("Cannot save endpoint with bound host socket"), and the agent's listening
socket is one (runsc's ``--host-uds=create``), as is every connection
accepted on it. So before a checkpoint the host asks ``POST /v1/park``: the
agent closes its listener, shuts every open connection (each thread then
closes its own), and waits in the sandbox with no host socket at all until
the host says it was restored: a file named :data:`RESUMED` appears in the
socket's directory (bound from the host, so a new gofer shows the host's
file after a restore). The agent then binds the socket again and serves on,
with every process and its memory as they were. The host deletes the file
before it parks the agent, so a park is never undone by a stale one.

A park is refused (the host then freezes the sandbox as without
checkpoints) while a TCP connection may be open or in TIME_WAIT
(:class:`TcpWatch`): gVisor cannot save one, and its failed checkpoint ends
the whole sandbox.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable

#: The file whose appearance, beside the socket, tells a parked agent it runs again.
RESUMED = "resumed"
#: The file the agent makes beside the socket once it holds no socket of the
#: host's any more: only then may the host checkpoint (a failed checkpoint
#: ends the sandbox).
PARKED = "parked"

#: How often a parked agent looks for :data:`RESUMED`: a restored agent answers
#: within this (each look is one gofer request; nothing else runs meanwhile).
POLL_SECONDS = 0.02


def resumed_marker(socket_path: str) -> str:
    """The file beside ``socket_path`` that ends a park.

    >>> resumed_marker("/.podbay/run/agent.sock")
    '/.podbay/run/resumed'
    """
    return os.path.join(os.path.dirname(socket_path), RESUMED)


def announce_parked(socket_path: str) -> None:
    """Tell the host every socket of its is closed (:data:`PARKED`)."""
    marker = os.path.join(os.path.dirname(socket_path), PARKED)
    try:
        os.close(os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o444))
    except OSError as exc:  # the host then times out and freezes the sandbox
        print(f"podbay-agent: cannot announce the park: {exc}", file=sys.stderr, flush=True)


def wait_until_resumed(marker: str, *, poll: Callable[[float], object] | None = None) -> None:
    """Block until ``marker`` exists."""
    wait = poll or threading.Event().wait
    while not os.path.exists(marker):
        wait(POLL_SECONDS)


#: gVisor's netstack (2022) keeps a closed TCP connection in TIME_WAIT this
#: long, and cannot save one that is connected or in TIME_WAIT: a checkpoint
#: then fails and runsc ends the sandbox. Loopback ones save, but are not told
#: apart in the counters below, so they count too.
TIME_WAIT_SECONDS = 60.0
#: How often :class:`TcpWatch` reads the counters.
SAMPLE_SECONDS = 5.0
SNMP = "/proc/net/snmp"


def tcp_counters(text: str) -> tuple[int, int]:
    """``(ActiveOpens + PassiveOpens, CurrEstab)`` from ``/proc/net/snmp``'s text.

    >>> tcp_counters("Tcp: ActiveOpens PassiveOpens CurrEstab\\nTcp: 3 1 2\\n")
    (4, 2)
    """
    rows = [line.split()[1:] for line in text.splitlines() if line.startswith("Tcp:")]
    if len(rows) < 2:
        return 0, 0
    values = dict(zip(rows[0], rows[1], strict=False))
    opens = int(values.get("ActiveOpens", 0)) + int(values.get("PassiveOpens", 0))
    return opens, int(values.get("CurrEstab", 0))


class TcpWatch:
    """When the sandbox last opened a TCP connection, sampled every
    :data:`SAMPLE_SECONDS` (a read of gVisor's own procfs), so that a park can
    be refused while a connection may still be open or in TIME_WAIT: the host
    then freezes the sandbox instead of checkpointing it."""

    def __init__(self, read: Callable[[], str] | None = None) -> None:
        self._read = read or _read_snmp
        self._opens: int | None = None
        self._changed = 0.0
        self._lock = threading.Lock()

    def start(self) -> None:
        self.sample()
        threading.Thread(target=self._run, name="tcp-watch", daemon=True).start()

    def _run(self) -> None:
        while True:
            threading.Event().wait(SAMPLE_SECONDS)
            self.sample()

    def sample(self, now: float | None = None) -> tuple[int, int]:
        opens, established = tcp_counters(self._read())
        with self._lock:
            if opens != self._opens:
                if self._opens is not None or opens > 0:
                    self._changed = time.monotonic() if now is None else now
                self._opens = opens
        return opens, established

    def refusal(self, now: float | None = None) -> str | None:
        """Why the sandbox cannot be checkpointed now, or None."""
        _, established = self.sample(now)
        if established:
            return f"{established} TCP connection(s) open"
        current = time.monotonic() if now is None else now
        with self._lock:
            changed = self._changed
        if changed and current - changed < TIME_WAIT_SECONDS + SAMPLE_SECONDS:
            return "a TCP connection was opened lately and may be in TIME_WAIT"
        return None


def _read_snmp() -> str:
    try:
        with open(SNMP) as f:
            return f.read()
    except OSError:
        return ""
