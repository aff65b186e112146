"""A deployment's named persistent volumes on this host (docs/volumes.md).

Each volume is a filesystem of its own: a sparse ext4 file of the volume's
size, loop-mounted. Its size is a hard limit the kernel enforces (a write
past it fails with ENOSPC inside the sandbox, and nothing else on the host
fills up), and a link made inside it can only name files of the volume
(hard links never cross filesystems). Sandboxes get ``data/`` of the mount,
owned by sandbox root (host uid ``uid_base``: every class maps sandbox uid
0 there), bound at the path attach names; ``lost+found`` and the
filesystem's root stay the host's.

Persistent, under ``<data_dir>/volumes/<deployment id>/<name>/``::

    volume.json     name, size, created_at (written last: the volume exists
                    exactly when it does)
    disk.ext4       the filesystem (sparse)

Volatile, under ``<run_dir>/volumes/<deployment id>/<name>/``: the mount
point, traversable by others (runsc's gofer opens bind sources as an
unprivileged host user). A volume is mounted when first used after a
reboot (:meth:`VolumeStore.mounted_data`) and stays mounted until deleted.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import shutil
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from podbay.errors import ApiError, DriverError
from podbay.settings import Settings
from podbay.wire.codes import ErrorCode
from podbay.wire.limits import VOLUME_NAME_PATTERN

from . import storage
from .layout import Layout
from .machine import VolumeBind
from .tools import check_tool

_NAME = re.compile(VOLUME_NAME_PATTERN)
_DEPLOYMENT = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
MIB = 1 << 20
#: ext4 with a journal needs a few MiB of its own; below this nothing is left.
MIN_VOLUME_BYTES = 16 * MIB
#: Sparse, so only what is written takes host disk; the bound keeps a typo
#: (bytes for MiB) from promising the host's whole disk.
MAX_VOLUME_BYTES = 1 << 40
META = "volume.json"
DISK = "disk.ext4"
#: The sandboxes' part of the mounted filesystem.
DATA = "data"
MOUNT_MODE = 0o711


@dataclass(frozen=True)
class VolumeInfo:
    name: str
    size_bytes: int
    used_bytes: int
    created_at: datetime


def check_volume_name(name: str) -> str:
    if not _NAME.fullmatch(name) or name in (".", ".."):
        raise ApiError(
            ErrorCode.VOLUME_NAME_INVALID,
            f"volume name {name[:80]!r} must match {VOLUME_NAME_PATTERN}",
        )
    return name


def check_volume_size(size_bytes: int) -> int:
    if not MIN_VOLUME_BYTES <= size_bytes <= MAX_VOLUME_BYTES:
        raise ApiError(
            ErrorCode.VOLUME_SIZE_INVALID,
            f"a volume's size is from {MIN_VOLUME_BYTES} bytes ({MIN_VOLUME_BYTES // MIB} MiB) "
            f"to {MAX_VOLUME_BYTES} bytes; {size_bytes} asked",
        )
    if size_bytes % 4096:
        raise ApiError(
            ErrorCode.VOLUME_SIZE_INVALID, f"a volume's size is a multiple of 4096; {size_bytes}"
        )
    return size_bytes


def _mount_data(disk: Path, target: Path, uid_base: int) -> Path:
    storage.mount_disk(disk, target)
    os.chmod(target, MOUNT_MODE)
    data = target / DATA
    try:
        data.mkdir(mode=0o755)
        os.lchown(data, uid_base, uid_base)
    except FileExistsError:
        pass
    return data


def remount(bind: VolumeBind, uid_base: int) -> None:
    """Mount a machine's volume again where its mount point is gone or empty
    (a reboot empties the run directory); a volume deleted meanwhile fails."""
    target = bind.source.parent
    if bind.disk is None or storage.holds_own_mount(target):
        return
    if not bind.disk.exists():
        raise DriverError(f"volume {target.name!r} no longer exists")
    for directory in (target.parent.parent, target.parent, target):
        directory.mkdir(mode=MOUNT_MODE, exist_ok=True)
        os.chmod(directory, MOUNT_MODE)
    _mount_data(bind.disk, target, uid_base)


def _not_found(name: str) -> ApiError:
    return ApiError(ErrorCode.VOLUME_NOT_FOUND, f"no volume named {name!r}")


class VolumeStore:
    """Every deployment's volumes on this host."""

    def __init__(self, data_root: Path, mount_root: Path, *, uid_base: int) -> None:
        self.data_root = data_root
        self.mount_root = mount_root
        self.uid_base = uid_base
        self._locks: dict[tuple[str, str], asyncio.Lock] = {}

    @classmethod
    def from_settings(cls, settings: Settings) -> VolumeStore:
        layout = Layout.from_settings(settings)
        return cls(layout.volumes, layout.volume_mounts, uid_base=settings.runtime.uid_base)

    def _lock(self, deployment_id: str, name: str) -> asyncio.Lock:
        return self._locks.setdefault((deployment_id, name), asyncio.Lock())

    def home(self, deployment_id: str, name: str) -> Path:
        if not _DEPLOYMENT.fullmatch(deployment_id):
            raise ValueError(f"invalid deployment id {deployment_id!r}")
        return self.data_root / deployment_id / check_volume_name(name)

    def mount_point(self, deployment_id: str, name: str) -> Path:
        self.home(deployment_id, name)  # checks both components
        return self.mount_root / deployment_id / name

    def _info(self, home: Path) -> VolumeInfo | None:
        try:
            meta = json.loads((home / META).read_text())
        except FileNotFoundError:
            return None
        used = 0
        mount = self.mount_root / home.parent.name / home.name
        if storage.holds_own_mount(mount):
            fs = os.statvfs(mount)
            used = (fs.f_blocks - fs.f_bfree) * fs.f_frsize
        return VolumeInfo(
            name=meta["name"],
            size_bytes=int(meta["size_bytes"]),
            used_bytes=used,
            created_at=datetime.fromisoformat(meta["created_at"]),
        )

    # -- the API's calls -----------------------------------------------------------
    async def create(self, deployment_id: str, name: str, size_bytes: int) -> VolumeInfo:
        check_volume_size(size_bytes)
        home = self.home(deployment_id, name)
        async with self._lock(deployment_id, name):
            if (home / META).exists():
                raise ApiError(ErrorCode.VOLUME_EXISTS, f"a volume named {name!r} exists")
            # A directory without its record is a create that died half-way.
            await asyncio.to_thread(shutil.rmtree, home, True)
            home.mkdir(parents=True, mode=0o700)
            try:
                await self._make(home, deployment_id, name, size_bytes)
            except BaseException:
                await asyncio.to_thread(self._remove, deployment_id, name)
                raise
            info = self._info(home)
            assert info is not None
            return info

    async def _make(self, home: Path, deployment_id: str, name: str, size_bytes: int) -> None:
        disk = home / DISK
        with open(disk, "wb") as f:  # noqa: ASYNC230 - truncate only, no I/O
            f.truncate(size_bytes)
        await check_tool(
            "mkfs.ext4",
            "-q",
            "-F",
            "-m",
            "0",  # no blocks kept for root: the sandbox gets the whole size
            "-L",
            "podbay-volume",
            "-E",
            "root_owner=0:0,lazy_itable_init=1,lazy_journal_init=1,nodiscard",
            str(disk),
            failed="mkfs.ext4 failed",
        )
        await asyncio.to_thread(self._mount, deployment_id, name)
        meta = {
            "name": name,
            "size_bytes": size_bytes,
            "created_at": datetime.now(UTC).isoformat(),
        }
        tmp = home / f".{META}.tmp"
        tmp.write_text(json.dumps(meta))
        os.rename(tmp, home / META)

    def _mount(self, deployment_id: str, name: str) -> Path:
        """Mount the volume (idempotent); its ``data/`` directory."""
        target = self.mount_point(deployment_id, name)
        for directory in (self.mount_root, target.parent, target):
            directory.mkdir(mode=MOUNT_MODE, parents=True, exist_ok=True)
            os.chmod(directory, MOUNT_MODE)
        return _mount_data(self.home(deployment_id, name) / DISK, target, self.uid_base)

    def disk(self, deployment_id: str, name: str) -> Path:
        """The volume's filesystem file."""
        return self.home(deployment_id, name) / DISK

    def list(self, deployment_id: str) -> list[VolumeInfo]:
        if not _DEPLOYMENT.fullmatch(deployment_id):
            return []
        try:
            homes = sorted((self.data_root / deployment_id).iterdir())
        except FileNotFoundError:
            return []
        return [info for home in homes if (info := self._info(home)) is not None]

    def get(self, deployment_id: str, name: str) -> VolumeInfo:
        info = self._info(self.home(deployment_id, name))
        if info is None:
            raise _not_found(name)
        return info

    async def mounted_data(self, deployment_id: str, name: str) -> Path:
        """The volume's ``data/`` directory, mounted: what a sandbox binds."""
        async with self._lock(deployment_id, name):
            self.get(deployment_id, name)
            return await asyncio.to_thread(self._mount, deployment_id, name)

    async def delete(self, deployment_id: str, name: str) -> None:
        """Unmount and remove it. The caller refuses while a sandbox names it."""
        async with self._lock(deployment_id, name):
            self.get(deployment_id, name)
            await asyncio.to_thread(self._remove, deployment_id, name)

    async def remove_deployment(self, deployment_id: str) -> tuple[str, ...]:
        """Every volume of a deleted deployment, unmounted (lazily: its sandboxes,
        being destroyed, keep what they hold until they end) and removed."""
        removed = []
        for info in self.list(deployment_id):
            async with self._lock(deployment_id, info.name):
                await asyncio.to_thread(self._remove, deployment_id, info.name)
            removed.append(info.name)
        with contextlib.suppress(OSError):
            (self.data_root / deployment_id).rmdir()
            (self.mount_root / deployment_id).rmdir()
        return tuple(removed)

    def unmount_all(self) -> tuple[Path, ...]:
        """Unmount every volume of this data directory (lazily), its files kept:
        what a test's cleanup does, so no loop device outlives its server."""
        done = []
        for point in sorted(storage.mountpoints()):
            path = Path(point)
            if path.parent.parent == self.mount_root and storage.sys_umount(path, lazy=True):
                done.append(path)
        return tuple(done)

    def _remove(self, deployment_id: str, name: str) -> None:
        home = self.home(deployment_id, name)
        (home / META).unlink(missing_ok=True)  # first: it is gone from then on
        target = self.mount_point(deployment_id, name)
        # Lazy: a process that still has it open keeps its loop device until it
        # lets go; the name and the record are gone at once.
        storage.sys_umount(target, lazy=True)
        for path in (home, target):
            shutil.rmtree(path, ignore_errors=True)
