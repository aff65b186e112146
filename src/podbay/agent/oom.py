"""The kernel's OOM killer in a sandbox: it takes commands, not the agent.

When a sandbox's memory cgroup runs out, the kernel kills the process with
the highest score: its size, plus ``oom_score_adj`` thousandths of the limit.
Left alone, a sandbox filled by many small processes loses its agent (the
largest of them). Every command the agent starts first raises its own
``oom_score_adj`` to :data:`COMMAND_SCORE` (raising needs no privilege; the
agent raises it for the command right after its exec, :func:`raise_score_of`,
where no ``preexec_fn`` runs anyway), so
any command outscores the agent, which keeps the default 0: lowering the
agent instead would need ``CAP_SYS_RESOURCE`` on the host, which not every
host grants (ours does not). A command may lower its score again, down to 0
and no lower (that too needs the privilege): then it competes with the agent
by size, and what it can take down is its own sandbox's agent.

Under runc the agent is non-dumpable (docs/runtime.md, "The agent inside"),
and so is a command's process between fork and exec: its ``/proc/self``
files belong to host root and it cannot write its own score. It then first
closes every descriptor it inherited from the agent but the one Python's
``subprocess`` reports exec errors on (the agent's sockets among them), and
only then makes itself dumpable to write the score: for the microseconds
until exec, what sandbox code could reach in it is a copy of the agent's
memory with none of its descriptors. The exec that follows makes it dumpable
anyway, as every command is.

Under gVisor the host's OOM killer sees one sandbox process and ends the
whole sandbox; the score inside gVisor's kernel changes nothing there.

:func:`kills` reads how many processes the OOM killer has killed in this
sandbox (``oom_kill`` of its memory cgroup), so an exec can say it lost a
process to it.
"""

from __future__ import annotations

import contextlib
import os
import resource
import sys
from collections.abc import Callable
from types import FrameType

#: ``oom_score_adj`` of every command: 1000 outscores any process left at 0.
COMMAND_SCORE = 1000

_SCORE = str(COMMAND_SCORE).encode()

#: Where the sandbox's own memory cgroup counts OOM kills (v2, then v1).
COUNTERS = ("/sys/fs/cgroup/memory.events", "/sys/fs/cgroup/memory/memory.oom_control")


def raise_own_score() -> None:
    """In a command's child process before it runs (a ``preexec_fn``): make it
    the OOM killer's choice over the agent. Best effort: a /proc that refuses
    it must not stop the command (then it competes with the agent by size)."""
    if _write_score():
        return
    keep = _exec_error_pipe()
    if keep is None or _prctl is None:
        return  # cannot tell which descriptor to keep: leave the score alone
    os.closerange(3, keep)
    os.closerange(keep + 1, _max_fd)
    if _prctl(_PR_SET_DUMPABLE, 1, 0, 0, 0) == 0:
        _write_score()


def raise_score_of(pid: int) -> bool:
    """In the agent, right after a command started (exec done): raise its score.

    This keeps ``subprocess`` on its vfork path (a ``preexec_fn`` forces a
    full fork plus Python in the child: 1.7x the cost of every exec). The
    price is a window of microseconds between the command's exec and this
    write in which a child it forks keeps score 0, as the agent has; such a
    child then competes with the agent by size, no more than a command that
    lowers its own score back to 0 (which it may) does. A command started
    with a ``preexec_fn`` anyway (gVisor's guard, terminals) still raises its
    own score before exec."""
    try:
        fd = os.open(f"/proc/{pid}/oom_score_adj", os.O_WRONLY)
    except OSError:
        return False
    try:
        return os.write(fd, _SCORE) == len(_SCORE)
    except OSError:
        return False
    finally:
        os.close(fd)


def prepare() -> None:
    """In the agent, before its first command: what :func:`raise_own_score`
    needs but must not load in a forked child (a library, a limit). Not at
    import: ctypes would cost every sandbox's start-up."""
    global _prctl, _max_fd, _prepared
    if _prepared:
        return
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        _prctl = ctypes.CDLL(None, use_errno=True).prctl
    _max_fd = max(3, resource.getrlimit(resource.RLIMIT_NOFILE)[0])
    _prepared = True


_PR_SET_DUMPABLE = 4
_prctl: Callable[..., int] | None = None
_max_fd = 1024
_prepared = False


def _write_score() -> bool:
    try:
        fd = os.open("/proc/self/oom_score_adj", os.O_WRONLY)
    except OSError:
        return False
    try:
        return os.write(fd, _SCORE) == len(_SCORE)
    except OSError:
        return False
    finally:
        os.close(fd)


def _exec_error_pipe() -> int | None:
    """The descriptor ``subprocess`` reports exec errors on, from the frame of
    ``Popen._execute_child`` that called us; ``None`` if it is not there."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        if frame.f_code.co_name == "_execute_child":
            fd = frame.f_locals.get("errpipe_write")
            return fd if isinstance(fd, int) and fd > 2 else None
        frame = frame.f_back
    return None


def kills() -> int | None:
    """Processes killed by the OOM killer in this sandbox so far; ``None``
    where the memory cgroup does not say (gVisor, no cgroup mounted)."""
    for path in COUNTERS:
        try:
            with open(path, "rb") as f:
                text = f.read(4096)
        except OSError:
            continue
        for line in text.splitlines():
            name, _, value = line.partition(b" ")
            if name == b"oom_kill" and value.strip().isdigit():
                return int(value)
    return None
