"""A volume's files without a sandbox: read, write, list, delete a path.

Sandboxes write these files, so every path is hostile: a sandbox may have
planted a symlink to ``/etc/shadow``, a FIFO that would block a reader, or
a directory swapped for a link between two calls. Every lookup goes through
``openat2(2)`` from the volume's own directory with ``RESOLVE_BENEATH``
(no ``..`` or absolute escape), ``RESOLVE_NO_SYMLINKS`` (no symlink on any
component, the last included), ``RESOLVE_NO_MAGICLINKS`` and
``RESOLVE_NO_XDEV`` (no mount crossed): the kernel checks the path it
walks, so no check-then-use gap exists. Files are opened non-blocking and
refused unless regular. Hard links cannot reach host files: the volume is a
filesystem of its own. What the API writes belongs to sandbox root (host
``uid_base``), as if a sandbox had written it.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import shutil
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from podbay.errors import ApiError
from podbay.wire.codes import ErrorCode

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
SYS_OPENAT2 = 437  # x86_64 and aarch64 alike
RESOLVE_NO_XDEV = 0x01
RESOLVE_NO_MAGICLINKS = 0x02
RESOLVE_NO_SYMLINKS = 0x04
RESOLVE_BENEATH = 0x08
RESOLVE = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV
#: What one read or listing answers at most (a larger file: read it in a sandbox).
MAX_READ_BYTES = 64 << 20
MAX_ENTRIES = 10_000
MAX_PATH = 4096


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


def openat2(dir_fd: int, path: str, flags: int, mode: int = 0) -> int:
    """``openat2(dir_fd, path)`` confined beneath ``dir_fd`` (see the module)."""
    how = _OpenHow(flags | os.O_CLOEXEC, mode, RESOLVE)
    fd = _libc.syscall(
        ctypes.c_long(SYS_OPENAT2),
        ctypes.c_int(dir_fd),
        ctypes.c_char_p(os.fsencode(path)),
        ctypes.byref(how),
        ctypes.c_size_t(ctypes.sizeof(how)),
    )
    if fd < 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err), path)
    return int(fd)


@dataclass(frozen=True)
class Entry:
    name: str
    type: Literal["file", "dir", "symlink", "other"]
    size: int


def check_path(path: str) -> str:
    """``path`` relative to the volume's root (a leading ``/`` is the root)."""
    rel = path.strip("/")
    try:
        path.encode()
    except UnicodeEncodeError:
        raise ApiError(ErrorCode.VOLUME_PATH_INVALID, "the path is not UTF-8") from None
    if len(path) > MAX_PATH or "\x00" in path:
        raise ApiError(ErrorCode.VOLUME_PATH_INVALID, f"path {path[:80]!r} is not a path")
    parts = rel.split("/") if rel else []
    if any(p in ("", ".", "..") for p in parts):
        raise ApiError(
            ErrorCode.VOLUME_PATH_INVALID, f"path {path[:80]!r}: no empty, '.' or '..' components"
        )
    return rel


def _refusal(exc: OSError, path: str) -> ApiError:
    if exc.errno == errno.ENOENT:
        return ApiError(ErrorCode.VOLUME_PATH_NOT_FOUND, f"no {path!r} in the volume")
    if exc.errno == errno.ENOSPC or exc.errno == errno.EDQUOT:
        return ApiError(ErrorCode.VOLUME_FULL, "the volume is full")
    if exc.errno in (errno.ELOOP, errno.EXDEV):
        return ApiError(
            ErrorCode.VOLUME_PATH_INVALID,
            f"{path!r} passes a symlink or leaves the volume: refused",
        )
    if exc.errno in (errno.ENOTDIR, errno.EISDIR, errno.ENXIO, errno.ENOTEMPTY, errno.EEXIST):
        return ApiError(ErrorCode.VOLUME_PATH_INVALID, f"{path!r}: {exc.strerror}")
    raise exc


@contextlib.contextmanager
def _fd(fd: int) -> Iterator[int]:
    try:
        yield fd
    finally:
        os.close(fd)


@contextlib.contextmanager
def _root(data: Path) -> Iterator[int]:
    with _fd(os.open(data, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)) as fd:
        yield fd


def read(data: Path, path: str) -> bytes:
    rel = check_path(path)
    try:
        with _root(data) as root, _fd(openat2(root, rel or ".", os.O_RDONLY | os.O_NONBLOCK)) as fd:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise ApiError(ErrorCode.VOLUME_PATH_INVALID, f"{path!r} is not a regular file")
            if info.st_size > MAX_READ_BYTES:
                raise ApiError(
                    ErrorCode.VOLUME_PATH_INVALID,
                    f"{path!r} is {info.st_size} bytes; at most {MAX_READ_BYTES} are read here",
                )
            chunks, left = [], MAX_READ_BYTES + 1
            while left > 0 and (chunk := os.read(fd, min(left, 1 << 20))):
                chunks.append(chunk)
                left -= len(chunk)
            return b"".join(chunks)[:MAX_READ_BYTES]
    except OSError as exc:
        raise _refusal(exc, path) from None


def _parent(root: int, rel: str, uid: int, make: bool) -> tuple[int, str]:
    """An fd of ``rel``'s directory (made, owned by ``uid``, when ``make``) and its name."""
    *dirs, name = rel.split("/")
    fd = os.dup(root)
    try:
        for part in dirs:
            if make:
                try:
                    os.mkdir(part, 0o755, dir_fd=fd)
                    # Not followed: what a sandbox swapped in meanwhile is not chowned.
                    os.chown(part, uid, uid, dir_fd=fd, follow_symlinks=False)
                except FileExistsError:
                    pass
            nxt = openat2(fd, part, os.O_PATH | os.O_DIRECTORY)
            os.close(fd)
            fd = nxt
        return fd, name
    except BaseException:
        os.close(fd)
        raise


def write(data: Path, path: str, content: bytes, *, uid: int) -> None:
    rel = check_path(path)
    if not rel:
        raise ApiError(ErrorCode.VOLUME_PATH_INVALID, "the volume's root is a directory")
    try:
        with _root(data) as root:
            parent, name = _parent(root, rel, uid, make=True)
            with _fd(parent):
                flags = os.O_WRONLY | os.O_NONBLOCK
                try:
                    fd = openat2(parent, name, flags | os.O_CREAT | os.O_EXCL, 0o644)
                    os.fchown(fd, uid, uid)  # new: sandbox root's, as if it wrote it
                except FileExistsError:
                    fd = openat2(parent, name, flags)  # an existing file keeps its owner
                with _fd(fd):
                    info = os.fstat(fd)
                    if not stat.S_ISREG(info.st_mode):
                        raise ApiError(
                            ErrorCode.VOLUME_PATH_INVALID, f"{path!r} is not a regular file"
                        )
                    os.ftruncate(fd, 0)
                    view = memoryview(content)
                    while view:
                        view = view[os.write(fd, view) :]
    except OSError as exc:
        raise _refusal(exc, path) from None


def delete(data: Path, path: str) -> None:
    """Remove a file, a symlink (itself, never its target) or a whole directory."""
    rel = check_path(path)
    if not rel:
        raise ApiError(ErrorCode.VOLUME_PATH_INVALID, "the volume's root is not removed")
    try:
        with _root(data) as root:
            parent, name = _parent(root, rel, -1, make=False)
            with _fd(parent):
                info = os.stat(name, dir_fd=parent, follow_symlinks=False)
                if stat.S_ISDIR(info.st_mode):
                    # Its own fd-relative walk: a symlink inside is removed, never followed.
                    shutil.rmtree(name, dir_fd=parent)
                else:
                    os.unlink(name, dir_fd=parent)
    except OSError as exc:
        raise _refusal(exc, path) from None


def listing(data: Path, path: str) -> list[Entry]:
    rel = check_path(path)
    try:
        with (
            _root(data) as root,
            _fd(openat2(root, rel or ".", os.O_RDONLY | os.O_DIRECTORY)) as fd,
        ):
            found: list[Entry] = []
            with os.scandir(fd) as entries:
                for entry in entries:
                    info = entry.stat(follow_symlinks=False)
                    kind: Literal["file", "dir", "symlink", "other"] = (
                        "dir"
                        if stat.S_ISDIR(info.st_mode)
                        else "file"
                        if stat.S_ISREG(info.st_mode)
                        else "symlink"
                        if stat.S_ISLNK(info.st_mode)
                        else "other"
                    )
                    found.append(Entry(entry.name, kind, info.st_size))
                    if len(found) >= MAX_ENTRIES:
                        break
            return sorted(found, key=lambda e: e.name)
    except OSError as exc:
        raise _refusal(exc, path) from None
