"""The kernel's OOM killer in a sandbox: it takes commands, not the agent.

When a sandbox's memory cgroup runs out, the kernel kills the process with
the highest score: its size, plus ``oom_score_adj`` thousandths of the limit.
Left alone, a sandbox filled by many small processes loses its agent (the
largest of them). The agent keeps the default 0 (lowering it would need
``CAP_SYS_RESOURCE`` on the host, which not every host grants: ours does
not) and raises every command instead, which needs no privilege:

- while it starts a command (``Popen``, a vfork) the agent raises its *own*
  score to :data:`SPAWN_SCORE` and lowers it back after (never below its
  minimum, 0, so no privilege is needed): the command and whatever it forks
  at once inherit 500;
- once the command runs, the agent raises it to :data:`COMMAND_SCORE`.

So every process of the sandbox outscores the agent, but for the instants
of a command's start, when the agent ties with the commands just started
and size decides. Raising each command in its child before exec (a
``preexec_fn``) would close that gap, but forces a fork of the agent instead
of a vfork, and the copy-on-write faults that follow triple the agent's
cost of an exec (bench/agent_exec.py; docs/performance.md).

Under runc the agent is non-dumpable: its ``/proc/self`` files belong to
host root and it cannot open its own score. The runtime starts it through a
shell that opens that file while still dumpable and execs the agent with it
open (``--oom-fd``). A command may lower its own score again, down to 0 and
no lower (that needs the privilege): then it competes with the agent by size.

Under gVisor the host's OOM killer sees one sandbox process and ends the
whole sandbox; the scores inside gVisor's kernel change nothing there. There
commands start from the launcher (:mod:`.launcher`), whose own score is
:data:`COMMAND_SCORE`: they inherit it.

:func:`kills` reads how many processes the OOM killer has killed in this
sandbox (``oom_kill`` of its memory cgroup), so an exec can say it lost a
process to it.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator

#: Every command once it runs: 1000 outscores any process left lower.
COMMAND_SCORE = 1000
#: The agent's own while it starts a command, so the command inherits it.
SPAWN_SCORE = 500

#: Where the sandbox's own memory cgroup counts OOM kills (v2, then v1).
COUNTERS = ("/sys/fs/cgroup/memory.events", "/sys/fs/cgroup/memory/memory.oom_control")

_own_score_fd: int | None = None


def adopt_own_score(fd: int) -> None:
    """Use ``fd``, the agent's own ``/proc/self/oom_score_adj`` opened for it
    before it became non-dumpable (kept from commands: close-on-exec). Ignored
    unless it reads as a score: it may be closed, or something else."""
    global _own_score_fd
    try:
        value = os.pread(fd, 16, 0).strip()
        if not -1000 <= int(value) <= 1000:
            return
        os.set_inheritable(fd, False)
    except (OSError, ValueError):
        return
    _own_score_fd = fd


def pass_on(on: bool) -> None:
    """Let the agent's own score descriptor survive its next exec (hibernation's
    waiter hands it back to the agent), or not."""
    if _own_score_fd is not None:
        with contextlib.suppress(OSError):
            os.set_inheritable(_own_score_fd, on)


@contextlib.contextmanager
def spawning() -> Iterator[None]:
    """Around starting a command: the agent's score at :data:`SPAWN_SCORE`."""
    fd = _own_score_fd
    if fd is None:
        yield
        return
    raised = _write(fd, SPAWN_SCORE)
    try:
        yield
    finally:
        if raised:
            _write(fd, 0)


def raise_command(pid: int) -> None:
    """Give a started command :data:`COMMAND_SCORE` (best effort: it may have
    exited already)."""
    with contextlib.suppress(OSError):
        fd = os.open(f"/proc/{pid}/oom_score_adj", os.O_WRONLY)
        try:
            _write(fd, COMMAND_SCORE)
        finally:
            os.close(fd)


def _write(fd: int, score: int) -> bool:
    try:
        data = str(score).encode()
        return os.pwrite(fd, data, 0) == len(data)
    except OSError:
        return False


def kills() -> int | None:
    """Processes killed by the OOM killer in this sandbox so far; ``None``
    where the memory cgroup does not say (gVisor, no cgroup mounted).

    Read twice per exec (before and after), so the counter file is opened
    once and re-read in place (one ``pread``): opening it through the buffered
    file objects each time was ~6 % of the agent's time per exec (py-spy)."""
    fd = _counter()
    if fd is None:
        return None
    try:
        text = os.pread(fd, 4096, 0)
    except OSError:
        return None
    for line in text.splitlines():
        name, _, value = line.partition(b" ")
        if name == b"oom_kill" and value.strip().isdigit():
            return int(value)
    return None


_counter_fd: int | None = None
_counter_looked = False
_counter_lock = threading.Lock()


def _counter() -> int | None:
    """The open counter file (close-on-exec; kept for the agent's life), the first
    of :data:`COUNTERS` that opens; looked for once."""
    global _counter_fd, _counter_looked
    if _counter_looked:
        return _counter_fd
    with _counter_lock:
        if not _counter_looked:
            for path in COUNTERS:
                try:
                    _counter_fd = os.open(path, os.O_RDONLY)
                except OSError:
                    continue
                break
            _counter_looked = True
    return _counter_fd
