"""Keep sandbox code away from the agent where the runtime cannot (gVisor).

Under runc the host kernel protects the agent: it runs non-dumpable with its
memory owned by the host's user namespace (docs/runtime.md, "The agent
inside"). gVisor's kernel must read what it executes, so that cannot apply,
and gVisor (2022) lets whoever owns a ``/proc/<pid>`` file open it: sandbox
root could read the agent's fds and environment, raise its OOM score and
signal it. With ``--guard-uid N`` (the runtime passes it for gVisor):

- the agent runs as uid and gid ``N``, keeping its capabilities
  (:func:`enable`);
- every command runs in a user namespace that maps ids ``0 .. N-1`` to
  themselves and leaves ``N`` out, made once by the launcher that starts
  them (:mod:`.launcher`, :func:`enter_own_namespace`). Root
  there is root over every file and process of the sandbox, but the agent's
  id is not one it can name or become, and its capabilities count only in
  that namespace: the kernel refuses it the agent's ``/proc`` files
  (``mem``, ``fd``, ``environ``, ``oom_score_adj``), ``ptrace`` and signals,
  as for any other user's process. Its capability bounding set is the
  agent's own (the runtime's set: no ``CAP_SYS_ADMIN``, no
  ``CAP_NET_ADMIN``), so owning that namespace gives it nothing more.

This gVisor has neither ``setns`` into a user namespace nor ``setfsuid``: so
the launcher makes the namespace with ``unshare`` while the agent writes its
id maps, and files the agent creates for a caller are
handed to root (:func:`claim`) instead of being created as root.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator
from typing import Any

from .protocol import DEFAULT_UID as DEFAULT_UID

_CLONE_NEWUSER = 0x10000000
_PR_SET_KEEPCAPS = 8
PR_CAPBSET_DROP = 24
_LINUX_CAPABILITY_VERSION_3 = 0x20080522

_uid: int | None = None
_unshare: Callable[[int], int] | None = None
_prctl: Callable[..., int] | None = None
#: Capabilities the agent does not have, dropped from every command's bounding set.
_not_ours: list[int] = []


def active() -> bool:
    return _uid is not None


def check(result: int, what: str) -> None:
    """Raise OSError, with the C library's errno, for a libc call that failed."""
    import ctypes  # only where a libc call is made: not at an unguarded start-up

    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def capabilities(libc: Any) -> tuple[Any, Any]:
    """This process's capability sets (``capget``, version 3): the header and
    the two halves (capabilities 0-31, 32-63) to change and :func:`set_capabilities`."""
    import ctypes

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [
            ("effective", ctypes.c_uint32),
            ("permitted", ctypes.c_uint32),
            ("inheritable", ctypes.c_uint32),
        ]

    header, data = Header(_LINUX_CAPABILITY_VERSION_3, 0), (Data * 2)()
    check(libc.capget(ctypes.byref(header), data), "capget")
    return header, data


def set_capabilities(libc: Any, header: Any, data: Any) -> None:
    """``capset`` what :func:`capabilities` read and the caller changed."""
    import ctypes

    check(libc.capset(ctypes.byref(header), data), "capset")


def enable(uid: int) -> None:
    """Become ``uid`` (and gid ``uid``) with every capability the agent had.
    Call before any thread starts. Raises OSError when the kernel refuses."""
    global _uid, _unshare, _prctl, _not_ours
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    check(libc.prctl(_PR_SET_KEEPCAPS, 1, 0, 0, 0), "keep capabilities")
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    # Leaving uid 0 emptied the effective set; the permitted one was kept.
    header, data = capabilities(libc)
    for half in data:
        half.effective = half.permitted
    set_capabilities(libc, header, data)
    ours = data[0].permitted | data[1].permitted << 32
    _not_ours = [cap for cap in range(64) if not ours >> cap & 1]
    _unshare, _prctl = libc.unshare, libc.prctl
    _uid = uid


#: The raw system calls :func:`acting_as` makes (``libc.syscall``), by machine:
#: glibc's own ``setresuid``, ``setgroups``... change every thread of the
#: process (it signals each one), and only the calling thread may change.
_SYSCALLS: dict[str, dict[str, int]] = {
    "x86_64": {"setgroups": 116, "setresuid": 117, "setresgid": 119},
    "aarch64": {"setgroups": 159, "setresuid": 147, "setresgid": 149},
}
_acting = threading.local()


def _ids_call(libc: Any, name: str, *args: Any) -> None:
    import ctypes
    import platform

    number = _SYSCALLS.get(platform.machine(), {}).get(name)
    if number is None:
        raise OSError(f"{name} per thread is not known on {platform.machine()}")
    check(libc.syscall(ctypes.c_long(number), *args), name)


@contextlib.contextmanager
def acting_as(uid: int, gid: int, groups: tuple[int, ...]) -> Iterator[None]:
    """Run the block with this thread's effective ids, groups and no effective
    capability, as ``uid`` would: the kernel checks its permissions and new
    files are its own. gVisor has no ``setfsuid``; its credentials are per
    thread as Linux's are, so the thread's effective uid stands in (the real
    and saved ids stay the agent's, and it takes its own back after).
    Raises OSError when the kernel refuses (nothing is left changed then)."""
    import ctypes

    assert _uid is not None
    libc = ctypes.CDLL(None, use_errno=True)
    header, data = capabilities(libc)
    keep = [half.effective for half in data]
    none = ctypes.c_int(-1)
    given = (ctypes.c_uint * max(1, len(groups)))(*groups)
    try:
        _ids_call(libc, "setgroups", ctypes.c_size_t(len(groups)), given)
        _ids_call(libc, "setresgid", none, ctypes.c_uint(gid), none)
        _ids_call(libc, "setresuid", none, ctypes.c_uint(uid), none)
        for half in data:  # from uid N to another non-zero uid: the kernel keeps them
            half.effective = 0
        set_capabilities(libc, header, data)
        _acting.user = True
    except BaseException:
        _take_back(libc, header, data, keep)
        raise
    try:
        yield
    finally:
        _acting.user = False
        _take_back(libc, header, data, keep)


def _take_back(libc: Any, header: Any, data: Any, effective: list[int]) -> None:
    """The agent's own ids and capabilities back on this thread; they must come
    back (a thread of the agent is never left acting as a user), so a refusal
    here ends the agent rather than leaving it so."""
    import ctypes

    assert _uid is not None
    try:
        for half, caps in zip(data, effective, strict=True):
            half.effective = caps
        set_capabilities(libc, header, data)
        ours = ctypes.c_uint(_uid)
        _ids_call(libc, "setresuid", ctypes.c_int(-1), ours, ctypes.c_int(-1))
        _ids_call(libc, "setresgid", ctypes.c_int(-1), ours, ctypes.c_int(-1))
        _ids_call(libc, "setgroups", ctypes.c_size_t(0), None)
    except OSError:
        os._exit(70)


@contextlib.contextmanager
def as_root_for_exec() -> Iterator[None]:
    """Around an exec of the agent's own command line (hibernation): this
    thread's ids back to root's, so that the program starts as the sandbox's
    first process did, with root's capabilities, and guards itself again. As
    uid ``N`` it would keep none across the exec (this gVisor has no ambient
    capabilities) and could no longer guard anything. Only the calling thread
    changes (the exec takes its credentials); if the exec fails, the block's
    end gives it the agent's ids and capabilities back. Nothing when not guarded.

    Root only in the instant before the exec, with no other process in the
    sandbox (the caller makes sure of that): no command can reach it then."""
    if _uid is None:
        yield
        return
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    header, data = capabilities(libc)
    keep = [half.effective for half in data]
    root = ctypes.c_uint(0)
    try:
        _ids_call(libc, "setresgid", root, root, root)
        _ids_call(libc, "setresuid", root, root, root)
        yield
    finally:
        own = ctypes.c_uint(_uid)
        try:
            # The gid first, while root may. To non-zero uids from root: the
            # kernel keeps the permitted set (keep-caps) and empties the
            # effective one, which comes back after.
            _ids_call(libc, "setresgid", own, own, own)
            _ids_call(libc, "setresuid", own, own, own)
            for half, caps in zip(data, keep, strict=True):
                half.effective = caps
            set_capabilities(libc, header, data)
        except OSError:
            os._exit(70)  # never left as root with sandbox code about


def foreign_caps() -> int:
    """The capabilities the agent does not have, as a mask (bit N: capability
    N), for the launcher program to drop from its bounding set."""
    return sum(1 << cap for cap in _not_ours)


def claim(path: str | int) -> None:
    """Hand what the agent just created (a path or an fd) to root, as if root
    had created it; nothing when the agent is root."""
    if _uid is None or getattr(_acting, "user", False):
        return  # a file made acting as a user is that user's already
    if isinstance(path, int):
        os.fchown(path, 0, 0)
    else:
        os.lchown(path, 0, 0)


@contextlib.contextmanager
def claiming_new_dirs(path: str) -> Iterator[None]:
    """Around creating ``path`` and its missing parents: :func:`claim` each
    directory that did not exist before."""
    missing: list[str] = []
    if _uid is not None and not getattr(_acting, "user", False):
        probe = os.path.abspath(path)
        while not os.path.lexists(probe):
            missing.append(probe)
            parent = os.path.dirname(probe)
            if parent == probe:
                break
            probe = parent
    yield
    for made in reversed(missing):
        with contextlib.suppress(FileNotFoundError):
            claim(made)


def map_ids(pid: int) -> None:
    """In the agent: give the user namespace ``pid`` just made (:func:`enter_own_namespace`)
    its id maps, ``0 .. N-1`` to themselves."""
    assert _uid is not None
    for name in ("uid_map", "gid_map"):
        with open(f"/proc/{pid}/{name}", "w") as f:
            f.write(f"0 0 {_uid}\n")


def enter_own_namespace(unshared: int, mapped: int) -> None:
    """In a child of the agent: a new user namespace, root in it with groups
    ``[0]``. Tells the agent its pid on the pipe
    ``unshared`` and waits on ``mapped`` while the agent calls :func:`map_ids`.
    Raises OSError when something is refused: then nothing may run."""
    assert _unshare is not None
    assert _prctl is not None
    if _unshare(_CLONE_NEWUSER) != 0:
        raise OSError("cannot make the commands' user namespace")
    for cap in _not_ours:  # a cap past the kernel's last one is EINVAL: fine
        _prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)
    os.write(unshared, str(os.getpid()).encode())
    if os.read(mapped, 1) != b"1":
        raise OSError("the commands' user namespace got no id map")
    os.setgroups([0])
    os.setresgid(0, 0, 0)
    os.setresuid(0, 0, 0)
