"""The operator's disk reserve: no new sandbox while the host's disk is short.

Sandbox disks are sparse files that grow as sandboxes write, so their sizes
add up to more than the host has (``podbay doctor`` reports by how much).
The reserve is the line: below it, attach refuses to create a sandbox
(``507 HOST_DISK_FULL``) and warm pools stop filling; running sandboxes keep
their disks (a full one gives ENOSPC inside).
"""

from __future__ import annotations

import shutil
from pathlib import Path

GIB = 1024**3


def reserve_shortfall(directory: Path, reserve: int, need: int = 0) -> str | None:
    """Why no new sandbox may be made, when ``directory``'s filesystem has less
    than ``reserve`` bytes free (``need`` more: a disk moving here); ``None``
    when it has room (or ``reserve`` is 0).

    >>> reserve_shortfall(Path("/"), 0) is None
    True
    """
    if reserve <= 0:
        return None
    probe = directory
    while not probe.exists():
        probe = probe.parent
    free = shutil.disk_usage(probe).free - need
    if free >= reserve:
        return None
    return (
        f"the host has {free / GIB:.1f} GiB free at {probe}"
        + (f" once a {need / GIB:.1f} GiB disk is written" if need else "")
        + f", below the reserve of "
        f"{reserve / GIB:.1f} GiB (runtime.disk_reserve_bytes): no new sandbox until "
        "space is freed"
    )
