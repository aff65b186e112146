"""Read-only ext4 images of the base image and of environment layers, for guests.

The base image and layers on the host are owned by the sandbox uid range
(``uid_base`` + n), because containers see them through a user namespace. A
guest has no such mapping: its root is real uid 0. So each tree is copied,
shifted back by ``uid_base`` (``chown`` clears set-id bits and file caps, so
modes are restored), and packed with ``mkfs.ext4 -d`` into an image without
a journal. That happens once per base image and once per layer; the images
are cached under ``<data>/vm/``.

Why ext4 images and not 9p or virtiofs: 9p passes host ownership through
(the shifted uids) and is slow under TCG for the many small files Python
imports; virtiofs needs a ``virtiofsd`` daemon per machine and shared memory.
A block device costs nothing per machine, and the guest's page cache serves
it; the price is a one-time build (measured: see docs/runtime-vm.md).

Whiteouts (0:0 character devices) and ``trusted.overlay.*`` xattrs survive
``cp -a`` and ``mkfs.ext4 -d``, so layers keep their deletions.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import os
import shutil
import stat
from pathlib import Path

from podbay.host.tools import check_tool

ID_RANGE = 65536


def _shift_tree(root: Path, delta: int, *, low: int, high: int) -> None:
    """Add ``delta`` to every uid/gid in ``[low, high)`` under ``root`` (not following
    symlinks), then restore the modes ``chown`` clears."""

    def fix(path: str) -> None:
        st = os.lstat(path)
        uid = st.st_uid + delta if low <= st.st_uid < high else st.st_uid
        gid = st.st_gid + delta if low <= st.st_gid < high else st.st_gid
        if (uid, gid) == (st.st_uid, st.st_gid):
            return
        os.lchown(path, uid, gid)
        if not stat.S_ISLNK(st.st_mode) and st.st_mode & 0o7000:
            os.chmod(path, stat.S_IMODE(st.st_mode))

    fix(str(root))
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            fix(os.path.join(dirpath, name))


def shift_down(root: Path, uid_base: int) -> None:
    """Host sandbox ids (``uid_base`` + n) → guest ids (n)."""
    _shift_tree(root, -uid_base, low=uid_base, high=uid_base + ID_RANGE)


def shift_up(root: Path, uid_base: int) -> None:
    """Guest ids (n) → host sandbox ids (``uid_base`` + n): a layer any class can use."""
    _shift_tree(root, uid_base, low=0, high=ID_RANGE)


def _tree_bytes(root: Path) -> tuple[int, int]:
    total, count = 0, 0
    for dirpath, dirnames, filenames in os.walk(root):
        count += 1 + len(dirnames) + len(filenames)
        for name in filenames:
            with contextlib.suppress(OSError):
                st = os.lstat(os.path.join(dirpath, name))
                total += st.st_blocks * 512
    return total, count


async def _run(*argv: str) -> None:
    await check_tool(*argv, failed=f"{argv[0]} failed")


async def pack(source: Path, target: Path, uid_base: int) -> Path:
    """``target``: an ext4 image of ``source`` with guest ownership (built once).

    Serialised between processes by a lock file beside ``target``."""
    if target.exists():  # noqa: ASYNC240 - one stat
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    lock_path = target.with_name(target.name + ".lock")
    with open(lock_path, "w") as lock:  # noqa: ASYNC230 - a lock file, no data
        await asyncio.to_thread(fcntl.flock, lock, fcntl.LOCK_EX)
        if target.exists():  # noqa: ASYNC240 - one stat
            return target
        work = target.with_name(f".{target.name}.{os.getpid()}")
        tree, image = work / "tree", work / "image.ext4"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir()
        try:
            await _run(
                "cp", "-a", "--preserve=all", "--no-target-directory", str(source), str(tree)
            )
            await asyncio.to_thread(shift_down, tree, uid_base)
            used, files = await asyncio.to_thread(_tree_bytes, tree)
            size = int(used * 1.25) + files * 4096 // 4 + 64 * 1024 * 1024
            with open(image, "wb") as out:  # noqa: ASYNC230 - truncate only
                out.truncate(size)
            await _run(
                "mkfs.ext4",
                "-q",
                "-F",
                "-O",
                "^has_journal",
                "-m",
                "0",
                "-N",
                str(files * 2 + 1024),
                "-E",
                "root_owner=0:0,nodiscard",
                "-d",
                str(tree),
                str(image),
            )
            os.chmod(image, 0o600)
            os.rename(image, target)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return target


def layer_key(layer: Path) -> str:
    """A layer directory is immutable once made: its path and inode name it."""
    st = layer.stat()
    blob = f"{layer.resolve()}\0{st.st_ino}\0{st.st_mtime_ns}".encode()
    return hashlib.sha256(blob).hexdigest()[:20]
