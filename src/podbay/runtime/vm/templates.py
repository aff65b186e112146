"""Boot once, restore many: snapshots of a booted guest waiting for its configuration.

Under TCG a cold boot costs seconds (the kernel's start-up and Python's are
translated instruction by instruction). So, per machine shape (memory, CPUs,
disk size, network on or off, layers and the boot files), the driver boots one
*template* guest in the background: it comes up with the agent imported and
its socket listening, then waits for a configuration frame. The template is
stopped, its RAM and devices saved with QMP ``migrate`` to a file, and its
disk copied; then it is killed.

A machine that starts for the first time with that shape (layers included) is
*restored* instead of booted: its disk becomes a copy of the template's (its
own was empty anyway), QEMU starts with ``-incoming`` from the saved state, and
the relay sends the machine's hostname, pids limit and environment before the
agent starts serving. Restored and booted guests are the same thereafter (a
later start boots from the machine's own disk).

Templates live under ``<data>/vm/templates/<key>/`` (``state``, ``disk.ext4``,
``initrd``, ``complete``); the key hashes everything a restore must match.
``complete`` lists the files the template was made from (kernel, initramfs,
base and layer disks): once one is gone the template can never be used again,
and ``podbay gc`` removes it (:func:`stale`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import shutil
import signal
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("podbay.runtime.vm")

#: Bump when what a template holds changes.
TEMPLATE_VERSION = 3
#: How long building one may take (a TCG boot on a busy host, then the save).
BUILD_SECONDS = 300.0


@dataclass(frozen=True)
class Shape:
    memory_mib: int
    cpus: int
    disk_bytes: int
    network: bool

    def key(self, *parts: str) -> str:
        blob = json.dumps(
            [TEMPLATE_VERSION, self.memory_mib, self.cpus, self.disk_bytes, self.network, *parts]
        )
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


# Alike in shape to VmPaths and oci's MachinePaths on purpose: one named
# property per file of a template, so each path has one home.
@dataclass(frozen=True)
class Template:
    root: Path

    @property
    def state(self) -> Path:
        return self.root / "state"

    @property
    def disk(self) -> Path:
        return self.root / "disk.ext4"

    @property
    def initrd(self) -> Path:
        return self.root / "initrd"

    @property
    def complete(self) -> bool:
        return (self.root / "complete").exists()


def mark_complete(root: Path, inputs: list[Path]) -> None:
    """Write ``complete``: the files the template stands on, for :func:`stale`."""
    marker = {"version": TEMPLATE_VERSION, "inputs": [str(p) for p in inputs]}
    (root / "complete").write_text(json.dumps(marker))


def stale(template: Template) -> bool:
    """Unusable for good: from another template version, or made from a file
    (kernel, initramfs, base or layer disk) that no longer exists. Templates
    still being built (no ``complete`` yet, hidden name) are not judged here."""
    try:
        marker = json.loads((template.root / "complete").read_text())
        inputs = [Path(p) for p in marker["inputs"]]
        return bool(marker["version"] != TEMPLATE_VERSION) or not all(p.exists() for p in inputs)
    except (OSError, ValueError, KeyError, TypeError):
        return True


def find(directory: Path, key: str) -> Template | None:
    template = Template(directory / key)
    return template if template.complete else None


async def wait_incoming(qmp_path: Path, within: float) -> None:
    """Until QEMU has loaded the saved state (it then waits, paused)."""
    from . import qmp

    async with asyncio.timeout(within):
        while True:
            with contextlib.suppress(OSError, ConnectionError):
                status = await qmp.execute(qmp_path, "query-status")
                if status.get("status") != "inmigrate":
                    return
            await asyncio.sleep(0.01)


async def save(qmp_path: Path, state: Path, within: float = 120.0) -> None:
    """Stop the guest and write its RAM and device state to ``state``."""
    from . import qmp

    await qmp.execute(qmp_path, "stop")
    await qmp.migrate(
        qmp_path, f"exec:cat > {state}", within=within, failure="saving the template failed"
    )


def kill(pidfile: Path, marker: str) -> None:
    """SIGKILL the QEMU a pid file names, if its command line holds ``marker``."""
    try:
        pid = int(pidfile.read_text().strip())
        if marker.encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
            os.kill(pid, signal.SIGKILL)
    except (OSError, ValueError):
        pass


def discard(root: Path) -> None:
    shutil.rmtree(root, ignore_errors=True)
