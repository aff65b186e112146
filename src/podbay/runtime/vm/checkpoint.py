"""Checkpoints of a ``vm`` machine: its guest's memory and devices on disk, no QEMU.

When ``vm`` is among ``runtime.checkpoint_classes``, suspending a machine
stops its guest, has QEMU write the guest's RAM and device state (QMP
``migrate`` to an ``exec:`` pipe, the one file target QEMU 7.2 has, read by a
small writer that hashes and fsyncs it) into the machine's own data
directory, and kills QEMU: the host keeps no memory of it
but this directory. Resuming starts a new QEMU with the same command line and
``-incoming`` from that file; the guest's processes run on where they were.

A checkpoint lives in ``<machine home>/checkpoint/`` (mode 0700, files 0600;
the data directory is the host's, nothing a guest can reach):

- ``state``: QEMU's migration stream;
- ``initrd``: the boot archive the guest was started with (the new QEMU is
  given the same command line; the archive is in the volatile run directory,
  which a reboot removes);
- ``manifest.json``: the sha256 and size of ``state`` (computed while QEMU
  wrote it), the sha256 of ``initrd``, and the size and mtime of the
  machine's disk once the guest could write it no more.

The directory is written as ``.checkpoint.partial`` and renamed whole once
its manifest is on disk: a machine has a checkpoint, or it does not. The guest
disk is part of the state (the guest's page cache in ``state`` refers to its
blocks), so a restore refuses a disk whose size or mtime changed, as it
refuses a ``state`` whose digest differs: with a :class:`DriverError`, before
anything has started, so the machine stays suspended.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shlex
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ..base import DriverError
from . import qmp

#: Bump when what a checkpoint holds changes.
CHECKPOINT_VERSION = 1
#: QEMU's migration is throttled to 128 MiB/s by default (meant for a live
#: guest on a network link); a stopped guest into a local file takes what it can.
UNTHROTTLED = 64 << 30
#: How long writing a guest's memory may take.
SAVE_SECONDS = 300.0


@dataclass(frozen=True)
class Checkpoint:
    """The checkpoint files of the machine whose data directory is ``home``."""

    home: Path

    @property
    def root(self) -> Path:
        return self.home / "checkpoint"

    @property
    def partial(self) -> Path:
        return self.home / ".checkpoint.partial"

    @property
    def state(self) -> Path:
        return self.root / "state"

    @property
    def initrd(self) -> Path:
        return self.root / "initrd"

    @property
    def manifest(self) -> Path:
        return self.root / "manifest.json"

    def exists(self) -> bool:
        """Whole (its manifest written and renamed into place)."""
        return self.manifest.exists()

    def discard(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
        shutil.rmtree(self.partial, ignore_errors=True)


def _sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _disk_stamp(disk: Path) -> dict[str, int]:
    st = disk.stat()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns}


#: Writes QEMU's stream to ``argv[1]``, fsynced, taking its sha256 and length
#: as it goes (no second read); then ``argv[2]`` (renamed into place) holds
#: "<sha256> <bytes>", or ``argv[3]`` why it failed. A write that fails ends
#: it at once, so QEMU meets a closed pipe and the migration fails.
WRITER = """
import hashlib, os, signal, sys
signal.signal(signal.SIGTERM, signal.SIG_IGN)
state, digest, error = sys.argv[1:4]
try:
    h, n = hashlib.sha256(), 0
    fd = os.open(state, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    while chunk := sys.stdin.buffer.read1(1 << 20):
        h.update(chunk)
        n += len(chunk)
        view = memoryview(chunk)
        while view:
            view = view[os.write(fd, view):]
    os.fsync(fd)
    os.close(fd)
    with open(digest + ".tmp", "w") as out:
        out.write(f"{h.hexdigest()} {n}")
    os.rename(digest + ".tmp", digest)
except BaseException as e:
    with open(error, "w") as out:
        out.write(repr(e))
    raise
"""
#: How long the writer may take after QEMU's last byte (its fsync, on a busy disk).
WRITER_SECONDS = 120.0


async def save(qmp_path: Path, checkpoint: Checkpoint, initrd: Path) -> None:
    """Stop the guest and write its memory and devices to ``checkpoint``'s
    partial directory (QEMU still runs, paused, when this returns: the caller
    seals the checkpoint, then kills QEMU)."""
    partial = checkpoint.partial
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(mode=0o700)
    state, digest, error = partial / "state", partial / "state.sha256", partial / "error"
    # Whether the writer has finished when QEMU reports the migration completed
    # is not QEMU's concern (nor is a child that lingers after the stream: some
    # versions signal it). So the writer ignores SIGTERM, runs under a shell
    # (QEMU's child), and says itself when its file is whole.
    args = " ".join(shlex.quote(str(a)) for a in (sys.executable, "-I", "-c", WRITER, state))
    pipe = f"umask 077; {args} {shlex.quote(str(digest))} {shlex.quote(str(error))}; exit"
    await qmp.execute(qmp_path, "stop")
    await qmp.execute(qmp_path, "migrate-set-parameters", {"max-bandwidth": UNTHROTTLED})
    await qmp.migrate(
        qmp_path, f"exec:{pipe}", within=SAVE_SECONDS, failure="writing the checkpoint failed"
    )
    try:
        async with asyncio.timeout(WRITER_SECONDS):
            while not digest.exists():
                if error.exists():
                    raise DriverError(f"writing the checkpoint failed: {error.read_text()}")
                await asyncio.sleep(0.01)
    except TimeoutError:
        raise DriverError("writing the checkpoint failed: its writer never finished") from None
    await asyncio.to_thread(copy_private, initrd, partial / "initrd")


def seal(checkpoint: Checkpoint, disk: Path) -> None:
    """Once the stream is written (QEMU, paused, writes the disk no more): write
    the manifest and make the checkpoint whole, on disk, to survive the host's
    restart."""
    partial = checkpoint.partial
    state = partial / "state"
    try:
        written, length = (partial / "state.sha256").read_text().split()
    except (OSError, ValueError):
        raise DriverError("writing the checkpoint failed: no digest of its state") from None
    if state.stat().st_size != int(length):
        raise DriverError("writing the checkpoint failed: its state file is short")
    manifest = {
        "version": CHECKPOINT_VERSION,
        "state": {"sha256": written, "size": int(length)},
        "initrd": _sha256(partial / "initrd"),
        "disk": _disk_stamp(disk),
    }
    (partial / "state.sha256").unlink()
    _fsync(partial / "initrd")  # the state was, by its writer
    target = partial / "manifest.json"
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump(manifest, out)
        out.flush()
        os.fsync(out.fileno())
    shutil.rmtree(checkpoint.root, ignore_errors=True)
    os.rename(partial, checkpoint.root)
    _fsync_dir(checkpoint.home)


def verify(checkpoint: Checkpoint, disk: Path) -> None:
    """Before a restore: the state is the one written (digest, size) and the
    disk is as the checkpoint left it; else :class:`DriverError`."""
    try:
        manifest = json.loads(checkpoint.manifest.read_text())
        expected = manifest["state"]
        if manifest["version"] != CHECKPOINT_VERSION:
            raise DriverError(
                f"checkpoint of version {manifest['version']}, not {CHECKPOINT_VERSION}"
            )
        if checkpoint.state.stat().st_size != expected["size"]:
            raise DriverError("the checkpoint's state file has the wrong size (damaged)")
        if _sha256(checkpoint.state) != expected["sha256"]:
            raise DriverError("the checkpoint's state file fails its sha256 check (damaged)")
        if _sha256(checkpoint.initrd) != manifest["initrd"]:
            raise DriverError("the checkpoint's boot archive fails its sha256 check (damaged)")
        if _disk_stamp(disk) != manifest["disk"]:
            raise DriverError("the machine's disk changed since its checkpoint")
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise DriverError(f"the checkpoint is unreadable: {e}") from None


def incoming(checkpoint: Checkpoint) -> list[str]:
    """QEMU's arguments to load the checkpoint (it then waits, paused)."""
    return ["-incoming", f"exec:cat {shlex.quote(str(checkpoint.state))}"]


async def wait_loaded(qmp_path: Path, alive: Callable[[], bool], within: float = 120.0) -> None:
    """Until QEMU has loaded the checkpoint (it leaves ``inmigrate``). A QEMU
    that could not load it exits: :class:`DriverError` then, not a wait."""
    async with asyncio.timeout(within):
        while True:
            try:
                status = await qmp.execute(qmp_path, "query-status")
            except (OSError, ConnectionError):
                status = {}
            if status.get("status") not in (None, "inmigrate"):
                return
            if not alive():
                raise DriverError("QEMU exited while loading the checkpoint")
            await asyncio.sleep(0.01)


def copy_private(source: Path, target: Path) -> None:
    """Copy ``source`` to a file only root can read."""
    with open(source, "rb") as src:
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as out:
            shutil.copyfileobj(src, out, 1 << 20)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
