"""What ``podbay gc --all`` clears after the machines: every cache of the data
directory (base images, layers, the agent bundle, disks, logs), keeping only
the state that cannot be made again, the store (deployments) and the signing
keys, which it names with their sizes so an uninstall can finish by hand.

Nothing is removed while a ``podbay serve`` runs on the data directory (it
stands on these files), and nothing mounted is descended into
(:func:`podbay.host.storage.remove_tree` refuses).
"""

from __future__ import annotations

import os
from pathlib import Path

#: What stays: the deployments (and their tokens' subjects) and the keys that sign.
KEPT = {
    "podbay.db": "the deployments",
    "podbay.db-wal": "the deployments",
    "podbay.db-shm": "the deployments",
    "keys": "the signing keys",
}


def servers_on(data_dir: Path) -> list[int]:
    """Pids of processes running ``serve`` (or ``node``) on ``data_dir``."""
    wanted = os.fsencode(str(data_dir))
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if wanted in argv and (b"serve" in argv or b"node" in argv) and b"gc" not in argv:
            found.append(int(entry.name))
    return found


def size_of(path: Path) -> int:
    """Bytes ``path`` holds on disk (allocated blocks: a sandbox's sparse disk
    file counts what it uses, not its apparent size)."""
    if not path.is_dir() or path.is_symlink():
        return path.lstat().st_blocks * 512
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
            except OSError:
                continue
    return total


def _empty_tree(path: Path) -> bool:
    """A directory holding directories only (nothing to reclaim)."""
    if not path.is_dir() or path.is_symlink():
        return False
    return not any(files for _, _, files in os.walk(path))


def human(size: int) -> str:
    """A size for people.

    >>> human(512), human(3 * 1024 * 1024)
    ('512 B', '3.0 MiB')
    """
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{size} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{size} B"


def clear(data_dir: Path) -> tuple[list[str], list[str]]:
    """Remove every entry of ``data_dir`` but :data:`KEPT`; (removed, kept) lines."""
    from podbay.host import storage
    from podbay.runtime.base import DriverError

    removed: list[str] = []
    kept: list[str] = []
    for entry in sorted(data_dir.iterdir()) if data_dir.is_dir() else []:
        if _empty_tree(entry):
            continue  # the layout's own directories, emptied by the machines' destruction
        size = size_of(entry)
        why = KEPT.get(entry.name)
        if why is None:
            try:
                storage.remove_tree(entry)
            except (DriverError, OSError) as exc:
                why = f"not removed: {exc}"
            else:
                removed.append(f"removed {entry} ({human(size)})")
                continue
        kept.append(f"kept {entry} ({why}, {human(size)})")
    return removed, kept
