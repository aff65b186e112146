"""Network namespaces through the kernel's own calls (ctypes; no ``ip``, no subprocess).

Namespace changes (``unshare``, ``setns``) apply to the calling *thread*. Every
function that changes the thread's namespace runs through :func:`in_fresh_thread`,
so a half-done change never leaks into the event loop or a pool thread.

A namespace outlives its first thread because it is bind-mounted on a file
(nsfs); that file is what a runtime names (OCI ``linux.namespaces[].path``),
what ``nsenter --net=FILE`` enters (:func:`enter_argv`), and what slirp4netns
attaches to.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import errno
import fcntl
import os
import socket
import struct
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

__all__ = [
    "bind_current",
    "enter",
    "enter_argv",
    "in_fresh_thread",
    "is_mounted",
    "lo_up",
    "set_sysctl",
    "unmount",
    "unshare",
]

_CLONE_NEWNET = 0x40000000
_MS_BIND = 0x1000
_MNT_DETACH = 0x2
_SIOCGIFFLAGS = 0x8913
_SIOCSIFFLAGS = 0x8914
_IFF_UP = 0x1

_libc: Any = None


def _lib() -> Any:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    return _libc


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def unshare() -> None:
    """Move the calling thread into a new, empty network namespace."""
    _check(_lib().unshare(_CLONE_NEWNET), "unshare(CLONE_NEWNET)")


def enter(path: Path) -> None:
    """Move the calling thread into the namespace mounted at ``path``."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        _check(_lib().setns(fd, _CLONE_NEWNET), "setns")
    finally:
        os.close(fd)


def enter_argv(path: Path) -> list[str]:
    """A command prefix that runs the rest of the command inside the namespace.

    ``nsenter --net`` changes only the network namespace; ``ip netns exec`` would
    also remount /sys, which hides the cgroup hierarchy from what it starts."""
    return ["nsenter", f"--net={path}", "--"]


def bind_current(path: Path) -> None:
    """Create ``path`` (it must not exist) and bind the calling thread's namespace on it."""
    fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    os.close(fd)
    source, target = b"/proc/thread-self/ns/net", str(path).encode()
    _check(_lib().mount(source, target, None, _MS_BIND, None), "mount")


def bind(source: Path, path: Path) -> None:
    """Create ``path`` (it must not exist) and bind the namespace file ``source`` on it."""
    fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    os.close(fd)
    _check(_lib().mount(str(source).encode(), str(path).encode(), None, _MS_BIND, None), "mount")


def unmount(path: Path) -> None:
    """Detach every mount stacked on ``path``; a path that is not a mount is fine."""
    for _ in range(16):
        if _lib().umount2(str(path).encode(), _MNT_DETACH) != 0:
            err = ctypes.get_errno()
            if err in (errno.EINVAL, errno.ENOENT):
                return
            raise OSError(err, f"umount {path}: {os.strerror(err)}")


def is_mounted(path: Path) -> bool:
    """``path`` holds a network namespace (an nsfs mount)."""
    try:
        return os.stat(path).st_dev == os.stat("/proc/self/ns/net").st_dev
    except OSError:
        return False


def lo_up() -> None:
    """Bring ``lo`` up in the calling thread's namespace (ioctl, no subprocess)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        req = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(s, _SIOCGIFFLAGS, req))[1]
        fcntl.ioctl(s, _SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | _IFF_UP))


def set_sysctl(name: str, value: str) -> None:
    # /proc/sys/net resolves against the *calling thread's* network namespace.
    with open(f"/proc/sys/{name.replace('.', '/')}", "w") as f:
        f.write(value)


T = TypeVar("T")


def in_fresh_thread(fn: Callable[[], T]) -> asyncio.Future[T]:
    """Run ``fn`` on a new OS thread that exits afterwards; await the result."""
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[T] = loop.create_future()

    def settle(result: Any, exc: BaseException | None) -> None:
        if fut.done():
            return
        if exc is not None:
            fut.set_exception(exc)
        else:
            fut.set_result(result)

    def run() -> None:
        try:
            result = fn()
        # Handed to the awaiting caller, which raises it.
        except BaseException as exc:  # noqa: BLE001
            loop.call_soon_threadsafe(settle, None, exc)
        else:
            loop.call_soon_threadsafe(settle, result, None)

    threading.Thread(target=run, name="podbay-netns", daemon=True).start()
    return fut


def run_in_thread_now(fn: Callable[[], None]) -> None:
    """Run ``fn`` on a throwaway thread and wait (synchronous callers, e.g. doctor)."""
    failure: list[BaseException] = []

    def run() -> None:
        try:
            fn()
        except BaseException as exc:  # noqa: BLE001 - raised in the caller's thread below
            failure.append(exc)

    thread = threading.Thread(target=run, name="podbay-netns-probe", daemon=True)
    thread.start()
    thread.join()
    if failure:
        raise failure[0]
