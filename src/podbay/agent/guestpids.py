"""Under gVisor, the sandbox's pids limit counts guest processes: a guest pids cgroup.

runsc applies ``linux.resources.pids`` to the *host* cgroup, where it counts
gVisor's own host threads (tens idle, about ten more per guest process under
the ptrace platform): a guest at that limit takes the whole sandbox down, as
gVisor cannot make a thread. So under the guard the runtime gives the host a
larger budget (``runtime/oci/runsc.py``, :func:`host_pids`) and passes the
sandbox's own limit with ``--pids-max N``; the agent then confines every
command to a cgroup of gVisor's kernel whose ``pids.max`` is ``N``
(:func:`confine`, at start-up, while it is still root):

- it mounts gVisor's pids hierarchy, makes the cgroup, writes its limit,
  keeps a descriptor on its ``cgroup.procs`` and detaches the mount again:
  no path in the sandbox leads to any cgroup file, so no command can raise
  ``pids.max`` or move itself out. Commands cannot mount one again: they hold
  no ``CAP_SYS_ADMIN`` where it counts (gVisor refuses it even to the root of
  a user namespace they make). The runtime grants the agent
  ``CAP_SYS_ADMIN`` for this alone; :func:`confine` drops it for good, from
  the bounding set too, before anything else runs.
- the launcher (:mod:`.launcher`) joins the cgroup in the agent's fork, before
  it executes anything (:func:`join`); every command is its child, and
  everything they start stays in the cgroup (a child cgroup is unreachable).
  The launcher counts as one of the ``N``.
- the agent stays outside: a fork bomb at the limit gets ``EAGAIN``, while the
  agent still has threads to answer, and its deadlines and kills end the bomb.

Without ``--pids-max`` (runc: the host's cgroup counts the container's own
processes already) nothing changes.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

from .guard import PR_CAPBSET_DROP, capabilities, check, set_capabilities

#: Where the pids hierarchy is mounted for a moment: an empty directory of
#: gVisor's read-only sysfs, there in every sandbox (mounting over a directory
#: writes nothing to its filesystem).
MOUNT_POINT = "/sys/fs/cgroup"
#: The commands' cgroup, under the hierarchy's root.
CGROUP = "podbay-commands"

_CAP_SYS_ADMIN = 21
_MNT_DETACH = 2

#: The commands' cgroup's ``cgroup.procs``, open for writing (None: not confined).
_procs: int | None = None


def confined() -> bool:
    return _procs is not None


def confine(limit: int, owner: int) -> None:
    """Make the commands' cgroup with ``pids.max`` = ``limit``, its files owned
    by ``owner`` (the guard's uid), and drop ``CAP_SYS_ADMIN`` for good (also
    when that fails). Call as the sandbox's root, before
    :func:`podbay.agent.guard.enable` and before any thread. Raises OSError
    when the cgroup cannot be made (the capability is gone)."""
    global _procs
    import ctypes  # here: an agent without the guard never loads it (its start-up)

    libc = ctypes.CDLL(None, use_errno=True)
    try:
        _procs = _make(libc, limit, owner)
    finally:
        _drop_sys_admin(libc)


def _make(libc: Any, limit: int, owner: int) -> int:
    check(libc.mount(b"none", MOUNT_POINT.encode(), b"cgroup", 0, b"pids"), "mount pids cgroup")
    try:
        where = f"{MOUNT_POINT}/{CGROUP}"
        with contextlib.suppress(FileExistsError):  # made by an earlier agent (hibernation)
            os.mkdir(where, 0o700)
        fd = os.open(f"{where}/pids.max", os.O_WRONLY | os.O_CLOEXEC)
        try:
            os.write(fd, str(limit).encode())
        finally:
            os.close(fd)
        # The agent's alone, not root's: gVisor opens /proc/1/fd/N to whoever may
        # open the file itself, and commands are root (over root's files only).
        for name in ("cgroup.procs", "tasks", "pids.max", ""):
            path = f"{where}/{name}".rstrip("/")
            os.chown(path, owner, owner)
            os.chmod(path, 0o700 if not name else 0o600)
        return os.open(f"{where}/cgroup.procs", os.O_WRONLY | os.O_CLOEXEC)
    finally:
        check(libc.umount2(MOUNT_POINT.encode(), _MNT_DETACH), "detach pids cgroup")


def _drop_sys_admin(libc: Any) -> None:
    """Out of the bounding, permitted and effective sets: commands (whose
    bounding set is the agent's, see :mod:`.guard`) never get it either."""
    errors = []
    if libc.prctl(PR_CAPBSET_DROP, _CAP_SYS_ADMIN, 0, 0, 0) != 0:
        errors.append("bounding set")
    try:
        header, data = capabilities(libc)
        bit = ~(1 << _CAP_SYS_ADMIN) & 0xFFFFFFFF
        for field in ("effective", "permitted", "inheritable"):
            setattr(data[0], field, getattr(data[0], field) & bit)
        set_capabilities(libc, header, data)
    except OSError as exc:
        errors.append(exc.strerror or str(exc))
    if errors:
        # Keeping it would hand it to every command: better no sandbox at all.
        raise SystemExit(f"podbay-agent: cannot drop CAP_SYS_ADMIN ({', '.join(errors)})")


def join() -> None:
    """Move the calling process into the commands' cgroup, if there is one:
    the launcher, in the agent's fork, before it executes anything.
    Raises OSError when refused (then it must not go on)."""
    if _procs is not None:
        os.write(_procs, b"0")  # "0": the writer itself
