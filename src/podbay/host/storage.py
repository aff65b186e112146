"""A machine's disk: a sparse ext4 file, loop-mounted, holding the overlay's upper layer.

The file is the hard size limit: a sandbox that fills it gets ENOSPC inside
while the host's filesystem and other sandboxes are untouched. Stopping a
machine unmounts it and keeps the file, so the next start finds every file
and installed package again.

Mounts are made with direct system calls (``LOOP_CONFIGURE``, ``mount(2)``)
rather than ``mount(8)``: each subprocess would cost milliseconds of the
create-to-ready budget. The loop device is auto-cleared on unmount.

Layout under the mounted disk: ``upper/`` (sandbox root owns it) and ``work/``.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import errno
import fcntl
import os
import secrets
import shutil
import struct
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from podbay.errors import DriverError

from . import records
from .tools import check_tool

GIB = 1024**3

MS_RDONLY = 1
#: Beside a machine's neutral views (:func:`neutral_view`): their empty second lower.
NEUTRAL_EMPTY = ".empty"
MS_NODEV = 4
MS_NOSUID = 2
MNT_DETACH = 2
LOOP_CTL_GET_FREE = 0x4C82
LOOP_CONFIGURE = 0x4C0A
LO_FLAGS_AUTOCLEAR = 4

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.mount.argtypes = [
    ctypes.c_char_p,
    ctypes.c_char_p,
    ctypes.c_char_p,
    ctypes.c_ulong,
    ctypes.c_char_p,
]
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]


def sys_mount(source: str, target: Path, fstype: str, flags: int = 0, data: str = "") -> None:
    if (
        _libc.mount(
            source.encode(),
            os.fsencode(target),
            fstype.encode(),
            flags,
            data.encode() if data else None,
        )
        != 0
    ):
        err = ctypes.get_errno()
        raise DriverError(f"mount {fstype} on {target} failed: {os.strerror(err)}")


def sys_umount(target: Path, *, lazy: bool = False) -> bool:
    """Unmount ``target``; ``False`` when nothing was mounted there."""
    if _libc.umount2(os.fsencode(target), MNT_DETACH if lazy else 0) != 0:
        err = ctypes.get_errno()
        if err in (errno.EINVAL, errno.ENOENT):
            return False
        raise DriverError(f"unmount {target} failed: {os.strerror(err)}")
    return True


def mountpoints() -> set[str]:
    """Every mount point of this process's mount namespace."""
    with open("/proc/self/mountinfo") as f:
        return {_unescape(line.split()[4]) for line in f}


def _unescape(field: str) -> str:
    return field.encode().decode("unicode_escape") if "\\" in field else field


def is_mounted(target: Path) -> bool:
    return str(target) in mountpoints()


def holds_own_mount(target: Path) -> bool:
    """Whether a filesystem of its own is mounted at ``target``: its device
    differs from its parent's. Two stats, where :func:`is_mounted` reads every
    mount on the host (hundreds of lines with many sandboxes); right for the
    disk and overlay mounts made here (a bind mount within one filesystem
    would go unseen)."""
    return os.path.ismount(target)


@dataclass(frozen=True)
class DiskCommitment:
    """What the machines' sparse disks may grow to, against what the host has."""

    machines: int
    #: The sum of every machine's disk size: what they may grow to.
    promised: int
    #: What their disk files hold on the host now.
    allocated: int
    #: Free on the host's filesystem.
    free: int

    @property
    def ratio(self) -> float:
        """Room the disks may still take over the room there is (above 1: overcommitted)."""
        return (self.promised - self.allocated) / max(self.free, 1)

    def describe(self, reserve: int) -> str:
        text = (
            f"{self.machines} sandbox disks may grow to {self.promised / GIB:.1f} GiB and "
            f"hold {self.allocated / GIB:.1f} GiB; {self.free / GIB:.1f} GiB free, "
            f"{reserve / GIB:.1f} GiB reserved"
        )
        if self.ratio > 1:
            return (
                text + f": overcommitted {self.ratio:.1f}x (new sandboxes are refused "
                "below the reserve; full disks give ENOSPC inside)"
            )
        return text + ": not overcommitted"


def disk_commitment(machines_dirs: list[Path]) -> DiskCommitment:
    """Every machine under ``machines_dirs`` (``<data_dir>/machines`` of each class)."""
    count = promised = allocated = 0
    for directory in dict.fromkeys(machines_dirs):
        try:
            homes = [p for p in directory.iterdir() if p.is_dir()]
        except FileNotFoundError:
            continue
        for home in homes:
            try:
                record = records.read(home)
            except (OSError, ValueError, KeyError):
                continue
            if record is None:
                continue
            count += 1
            promised += record.spec.limits.disk_bytes
            with contextlib.suppress(OSError):
                allocated += os.stat(home / "disk.ext4").st_blocks * 512
    probe = machines_dirs[0] if machines_dirs else Path("/")
    while not probe.exists():
        probe = probe.parent
    return DiskCommitment(count, promised, allocated, shutil.disk_usage(probe).free)


async def make_disk(
    path: Path, size: int, templates: Path, *, then: Callable[[], None] | None = None
) -> None:
    """A sparse ``size``-byte ext4 file. Its root stays the host's: the sandbox
    only ever sees ``upper/`` (owned by sandbox root, see :func:`prepare_upper`).
    ``then`` runs in the copy's thread once the file is in place (one hand-off
    to a thread and back, where two cost a create milliseconds on a busy host).

    ``mkfs.ext4`` runs once per size, into ``templates``; each machine's disk is
    a sparse copy of that (its ~0.25 MB of metadata at 10 GiB, in the kernel),
    which takes a few milliseconds where ``mkfs`` takes twenty. The copies share
    the filesystem UUID, which nothing here relies on."""
    template = templates / f"ext4-{size}.img"
    if not template.exists():
        await _mkfs(template, size)
    tmp = path.with_suffix(".tmp")

    def copy() -> None:
        _sparse_copy(template, tmp, size)
        os.rename(tmp, path)
        if then is not None:
            then()

    await asyncio.to_thread(copy)


async def _mkfs(target: Path, size: int) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    # Unique per call: two creates of one size in one process may race here.
    tmp = target.with_name(f".{target.name}.{os.getpid()}.{secrets.token_hex(4)}")
    with open(tmp, "wb") as f:  # noqa: ASYNC230 - truncate only, no I/O
        f.truncate(size)
    try:
        await check_tool(
            "mkfs.ext4",
            "-q",
            "-F",
            "-m",
            "0",
            "-L",
            "podbay",
            # No blocks reserved for growing the filesystem while mounted (nothing
            # resizes a sandbox's disk): for 10 GiB they were 4 MB of the 4.2 MB
            # every machine's disk copied from the template.
            "-O",
            "^resize_inode",
            "-E",
            "root_owner=0:0,lazy_itable_init=1,lazy_journal_init=1,nodiscard",
            str(tmp),
            failed="mkfs.ext4 failed",
        )
    except DriverError:
        tmp.unlink(missing_ok=True)
        raise
    os.rename(tmp, target)  # atomic: a racing creator's equal copy is as good


def data_extents(fd: int) -> list[tuple[int, int]]:
    """A file's data extents (``SEEK_DATA``/``SEEK_HOLE``), as (offset, length):
    what a sparse copy or a disk's transfer reads, holes left out."""
    found: list[tuple[int, int]] = []
    position = 0
    while True:
        try:
            start = os.lseek(fd, position, os.SEEK_DATA)
        except OSError as e:
            if e.errno == errno.ENXIO:  # no data past here
                return found
            raise
        end = os.lseek(fd, start, os.SEEK_HOLE)
        found.append((start, end - start))
        position = end


def _sparse_copy(source: Path, target: Path, size: int, *, sync: bool = True) -> None:
    """Copy only ``source``'s data extents (``sync``: to stable storage before
    returning; a caller that holds something still, such as a frozen sandbox,
    syncs once it let go: :func:`sparse_copy`)."""
    src = os.open(source, os.O_RDONLY | os.O_CLOEXEC)
    try:
        dst = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        try:
            os.ftruncate(dst, size)
            for start, length in data_extents(src):
                offset, end = start, start + length
                while offset < end:
                    copied = os.copy_file_range(src, dst, end - offset, offset, offset)
                    if copied == 0:
                        raise DriverError(f"short copy of {source}")
                    offset += copied
            if sync:
                os.fsync(dst)
        finally:
            os.close(dst)
    finally:
        os.close(src)


def sparse_copy(source: Path, target: Path, *, sync: bool = True) -> None:
    """A copy of the sparse file ``source`` at ``target`` (holes kept; the
    kernel copies, and shares blocks where the filesystem can)."""
    _sparse_copy(source, target, source.stat().st_size, sync=sync)


def sync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def syncfs(directory: Path) -> None:
    """Write everything cached for the filesystem holding ``directory`` to its
    device (for a loop-mounted disk: into its file), that filesystem alone."""
    import ctypes  # here: only a fork of a running machine needs it

    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        if libc.syncfs(fd) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err), str(directory))
    finally:
        os.close(fd)


def attach_loop(image: Path) -> tuple[str, int]:
    """Bind ``image`` to a free loop device; its path and an open fd of it.

    The device is auto-cleared when its last user goes, so the caller must
    keep the fd open until the filesystem on it is mounted, then close it."""
    backing = os.open(image, os.O_RDWR | os.O_CLOEXEC)
    try:
        ctl = os.open("/dev/loop-control", os.O_RDWR | os.O_CLOEXEC)
        try:
            for _ in range(32):
                number = fcntl.ioctl(ctl, LOOP_CTL_GET_FREE)
                device = f"/dev/loop{number}"
                try:
                    dev_fd = os.open(device, os.O_RDWR | os.O_CLOEXEC)
                except FileNotFoundError:
                    continue
                configured = False
                try:
                    # struct loop_config { u32 fd; u32 block_size; loop_info64 info; u64 r[8]; }
                    info = bytearray(232)
                    struct.pack_into("=I", info, 52, LO_FLAGS_AUTOCLEAR)  # lo_flags
                    name = os.fsencode(image)[:63]
                    info[56 : 56 + len(name)] = name  # lo_file_name
                    config = struct.pack("=II", backing, 0) + bytes(info) + bytes(64)
                    try:
                        fcntl.ioctl(dev_fd, LOOP_CONFIGURE, config)
                    except OSError as e:
                        if e.errno == errno.EBUSY:  # another process took it first
                            continue
                        raise
                    configured = True
                    return device, dev_fd
                finally:
                    if not configured:
                        os.close(dev_fd)
        finally:
            os.close(ctl)
    finally:
        os.close(backing)
    raise DriverError("no free loop device")


def mount_disk(image: Path, target: Path, *, readonly: bool = False) -> None:
    """Loop-mount the machine's ext4 file at ``target`` (idempotent)."""
    if holds_own_mount(target):
        return
    target.mkdir(parents=True, exist_ok=True)
    device, fd = attach_loop(image)
    try:
        # discard: a deletion inside punches the blocks out of the sparse file
        # (the loop device passes it on), so the host gets the space back.
        sys_mount(
            device,
            target,
            "ext4",
            MS_NODEV | MS_NOSUID | (MS_RDONLY if readonly else 0),
            "" if readonly else "discard",
        )
    finally:
        os.close(fd)  # the mount now holds the device; unmounting frees it


def prepare_upper(disk_mount: Path, uid_base: int) -> tuple[Path, Path]:
    """``upper/`` (owned by sandbox root) and ``work/`` on the mounted disk."""
    upper, work = disk_mount / "upper", disk_mount / "work"
    for path in (upper, work):
        try:
            path.mkdir(mode=0o755)
        except FileExistsError:
            continue
    os.lchown(upper, uid_base, uid_base)
    return upper, work


@contextlib.contextmanager
def _by_descriptor(paths: Sequence[Path]) -> Iterator[list[str]]:
    """``paths`` as ``/proc/self/fd/N`` names, open meanwhile. overlayfs keeps
    the names it is given and shows them in every ``/proc/*/mountinfo``, the
    sandbox's own included: these name no directory of the host."""
    fds: list[int] = []
    try:
        for path in paths:
            try:
                fds.append(os.open(path, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC))
            except OSError as exc:
                raise DriverError(f"cannot mount {path}: {exc.strerror}") from exc
        yield [f"/proc/self/fd/{fd}" for fd in fds]
    finally:
        for fd in fds:
            os.close(fd)


def mount_overlay(target: Path, lowers: list[Path], upper: Path, work: Path) -> None:
    """The machine's root filesystem: ``lowers`` highest first (idempotent)."""
    if holds_own_mount(target):
        return
    target.mkdir(parents=True, exist_ok=True)
    with _by_descriptor([*lowers, upper, work]) as names:
        *lower_names, upper_name, work_name = names
        options = (
            f"lowerdir={':'.join(lower_names)},upperdir={upper_name},workdir={work_name},"
            "index=off,metacopy=off"
        )
        sys_mount("overlay", target, "overlay", MS_NODEV, options)


_NEUTRAL_LOCK = threading.Lock()


def neutral_view(source: Path, target: Path) -> Path:
    """``source``, read-only, at ``target``: an overlay of its own, made once and
    kept (it serves every machine; ``podbay gc --all`` unmounts it).

    A bind mount shows the sandbox its source's path within the source's
    filesystem (mountinfo's root field: ``/var/lib/podbay/agent/...``); bound
    from here, a path within this overlay, whose options name only
    ``/proc/self/fd`` entries (see :func:`_by_descriptor`)."""
    with _NEUTRAL_LOCK:
        if holds_own_mount(target):
            return target
        target.mkdir(mode=0o755, parents=True, exist_ok=True)
        empty = target.parent / NEUTRAL_EMPTY  # overlayfs wants two lowers without an upper
        empty.mkdir(mode=0o755, exist_ok=True)
        with _by_descriptor([source, empty]) as names:
            flags = MS_RDONLY | MS_NODEV | MS_NOSUID
            sys_mount("overlay", target, "overlay", flags, f"lowerdir={':'.join(names)}")
    return target


def unmount_views(directory: Path) -> list[str]:
    """Unmount every :func:`neutral_view` under ``directory`` (lazily where busy)
    and remove it; the names of those unmounted."""
    gone = []
    with contextlib.suppress(FileNotFoundError):
        for view in sorted(directory.iterdir()):
            if holds_own_mount(view):
                try:
                    sys_umount(view)
                except DriverError:  # busy (a machine starting): gone once it is not
                    sys_umount(view, lazy=True)
                gone.append(view.name)
            with contextlib.suppress(OSError):
                view.rmdir()
    return gone


def loop_devices_for(paths: set[str]) -> list[str]:
    """Loop devices whose backing file is one of ``paths`` (for gc and cleanup checks)."""
    found = []
    for entry in Path("/sys/block").glob("loop*"):
        try:
            backing = (entry / "loop" / "backing_file").read_text().strip()
        except OSError:
            continue
        if backing.removesuffix(" (deleted)") in paths:
            found.append(f"/dev/{entry.name}")
    return found


def unmount_machine(rootfs: Path, disk_mount: Path) -> None:
    """Unmount a machine's overlay, then its disk (retrying while busy for a
    second, then detaching lazily), and remove the empty mount points."""
    for target in (rootfs, disk_mount):
        for attempt in range(50):
            try:
                if not sys_umount(target):
                    break
            except DriverError:
                if attempt == 49:
                    sys_umount(target, lazy=True)
                    break
                time.sleep(0.02)
        with contextlib.suppress(OSError):
            target.rmdir()


def remove_tree(path: Path) -> None:
    """Remove a machine directory, refusing while anything is mounted inside it
    (``rmtree`` would otherwise descend into a sandbox's files)."""
    if path.is_dir() and not path.is_symlink():
        if is_mounted(path) or any(m.startswith(f"{path}/") for m in mountpoints()):
            raise DriverError(f"refusing to remove {path}: something is still mounted in it")
        shutil.rmtree(path)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


async def copy_layer(upper: Path, dest: Path) -> None:
    """Copy an overlay upper directory to ``dest`` as a reusable lower layer.

    ``cp -a`` keeps what overlayfs needs: ownership (already in the sandbox uid
    range), modes, hard links, sparse files, whiteouts (0:0 character devices)
    and ``trusted.overlay.*`` xattrs (opaque directories). Symlinks are copied,
    never followed."""
    if not os.path.isdir(upper):  # noqa: ASYNC240 - never started: an empty layer
        os.makedirs(dest, exist_ok=True)
        return
    await check_tool(
        "cp",
        "-a",
        "--preserve=all",
        "--sparse=always",
        "--no-target-directory",
        str(upper),
        str(dest),
        failed="copying the layer failed",
    )
