"""The only place the agent waits for children: one thread reaps them all.

The agent is the sandbox's init (PID 1), so every orphan in the sandbox is
re-parented to it and must be reaped, or zombies pile up until the process
table is full. One thread calls ``waitpid(-1)`` for everything and hands each
exit status to whoever registered that pid; statuses nobody asked for
(orphans) are simply dropped. Nothing else in the agent calls ``waitpid``,
``Popen.wait`` or ``Popen.poll``: two waiters would race for the same status.

Registration and the fork that creates the pid happen under
:attr:`Reaper.lock`, and the reaper takes the same lock before it dispatches a
status, so a child that exits at once is never missed.

When the agent is not PID 1 (tests, local debugging) it makes itself a
*child subreaper* (``PR_SET_CHILD_SUBREAPER``) so that orphans of its commands
still come back to it and are reaped the same way.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable

#: How long the reaper sleeps when the agent has no child at all. Children the
#: agent starts wake it at once; the timeout only bounds how long an orphan
#: re-parented from outside (a process entered with ``nsenter``) waits.
IDLE_RECHECK_SECONDS = 1.0

PR_SET_CHILD_SUBREAPER = 36

ExitCallback = Callable[[int], None]


def exit_code(status: int) -> int:
    """A wait status as a shell would report it: the code, or 128+N for signal N.

    >>> exit_code(0x0100), exit_code(9)
    (1, 137)
    """
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code


def become_subreaper() -> bool:
    """Ask the kernel to re-parent our orphaned descendants to us (Linux only)."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes  # only here: PID 1 needs no prctl, and ctypes costs RSS

    libc = ctypes.CDLL(None, use_errno=True)
    return bool(libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)


class Reaper:
    """Reap every child; call the callback registered for its pid with its code."""

    def __init__(self) -> None:
        #: Held while forking a child and registering it (see module docstring).
        self.lock = threading.Lock()
        self._callbacks: dict[int, ExitCallback] = {}
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._run, name="reaper", daemon=True)
        self.reaped = 0

    def start(self) -> None:
        self._thread.start()

    def register(self, pid: int, callback: ExitCallback) -> None:
        """Call ``callback(exit_code)`` when ``pid`` exits. Hold :attr:`lock`."""
        self._callbacks[pid] = callback
        self._wake.set()

    def _run(self) -> None:
        while True:
            self._wake.clear()
            try:
                pid, status = os.waitpid(-1, 0)
            except ChildProcessError:
                self._wake.wait(IDLE_RECHECK_SECONDS)
                continue
            except InterruptedError:  # pragma: no cover - PEP 475 retries
                continue
            self.reaped += 1
            self.deliver(pid, exit_code(status))

    def deliver(self, pid: int, code: int) -> None:
        """Hand ``pid``'s exit code to its callback, if one is registered (also
        for a child of the launcher, which reaps its own: see :mod:`.launcher`)."""
        with self.lock:
            callback = self._callbacks.pop(pid, None)
        if callback is not None:
            try:
                callback(code)
            # Logged; a callback's bug must not stop the reaping.
            except Exception as exc:  # noqa: BLE001
                print(f"podbay-agent: exit callback for {pid} failed: {exc!r}", file=sys.stderr)
