"""Waiting on a file descriptor from asyncio: a pipe's ready byte, a pidfd's exit,
a name made in a directory (inotify)."""

from __future__ import annotations

import asyncio
import ctypes
import functools
import os
from pathlib import Path

_IN_CLOEXEC = os.O_CLOEXEC
_IN_NONBLOCK = os.O_NONBLOCK
_IN_CREATE = 0x100
_IN_MOVED_TO = 0x80


async def wait_readable(fd: int, within: float | None = None) -> bool:
    """True once ``fd`` is readable; False if ``within`` seconds pass first.

    A pidfd turns readable when its process exits; a pipe when it has data or
    its writer is gone."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()

    def ready() -> None:
        if not done.done():
            done.set_result(None)

    loop.add_reader(fd, ready)
    try:
        await asyncio.wait_for(done, within)
        return True
    except TimeoutError:
        return False
    finally:
        loop.remove_reader(fd)


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def watch_created(directory: Path) -> int | None:
    """An inotify descriptor that turns readable when a name is made in (or moved
    into) ``directory`` (drain it with :func:`drain`, end it with
    :func:`close_watch`), or None where inotify cannot be had (e.g. the user's
    128 instances are taken): the caller then polls."""
    libc = _libc()
    fd = int(libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC))
    if fd < 0:
        return None
    if libc.inotify_add_watch(fd, os.fsencode(directory), _IN_CREATE | _IN_MOVED_TO) < 0:
        os.close(fd)
        return None
    return fd


def drain(fd: int) -> None:
    """Read away what a non-blocking descriptor (:func:`watch_created`'s) holds."""
    try:
        while os.read(fd, 4096):
            pass
    except BlockingIOError:
        pass


def close_watch(fd: int) -> None:
    """Close :func:`watch_created`'s descriptor in a thread of the running loop:
    the kernel waits for an SRCU grace period as an inotify instance ends
    (~12 ms a start, measured), which the caller need not wait for."""
    asyncio.get_running_loop().run_in_executor(None, os.close, fd)
