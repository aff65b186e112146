"""What a machine uses now, read from what the host already keeps: cgroup
counters, the machine's disk and its network namespace's interfaces.

Every read is a few small files of ``/sys`` and ``/proc`` (no process start,
no agent call), so a node samples each running machine every few seconds for
a negligible share of a core (``bench/metrics_cost.py``). A driver whose
machines these do not describe (the ``vm`` class: a guest's freed memory
stays with QEMU) reads what it lacks from the guest (:class:`MeasuredDriver`).

Memory is the working set: what the cgroup is charged minus its inactive page
cache, which the kernel takes back first (as container tools report it), so a
program's freed memory leaves the figure at once.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

from podbay.host.cgroups import Cgroups
from podbay.wire.observe import net_dev_bytes

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True, kw_only=True)
class Usage:
    """One reading. ``cpu_seconds`` and the network bytes are counters since
    the machine started; the rest are levels."""

    cpu_seconds: float
    memory_bytes: int
    memory_limit_bytes: int
    disk_bytes: int
    net_rx_bytes: int
    net_tx_bytes: int
    #: Processes the out-of-memory killer ended, since the machine started.
    oom_kills: int = 0


@runtime_checkable
class MeasuredDriver(Protocol):
    """A driver that reports its running machines' use."""

    async def usage(self, machine_id: str) -> Usage | None:
        """The machine's use now, or None when it does not run here."""
        ...


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:  # gone meanwhile: the machine stopped
        return None


def _stat_value(text: str, key: str) -> int:
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name == key and value.strip().isdigit():
            return int(value)
    return 0


def cgroup_cpu_memory(cgroups: Cgroups, path: str) -> tuple[float, int, int] | None:
    """CPU seconds used, the working set and the OOM kills of the cgroup
    ``path``, or None when it does not exist (the machine is not running)."""
    rel = path.strip("/")
    if cgroups.version == 2:
        base = cgroups.root / rel
        cpu = _read(base / "cpu.stat")
        current = _read(base / "memory.current")
        stat = _read(base / "memory.stat")
        if cpu is None or current is None or stat is None:
            return None
        seconds = _stat_value(cpu, "usage_usec") / 1e6
        inactive = _stat_value(stat, "inactive_file")
        kills = _stat_value(_read(base / "memory.events") or "", "oom_kill")
    else:
        memory = cgroups.root / "memory" / rel
        current = _read(memory / "memory.usage_in_bytes")
        stat = _read(memory / "memory.stat")
        if current is None or stat is None:
            return None
        usage = _read(cgroups.root / "cpuacct" / rel / "cpuacct.usage")
        # A cgroup made without the cpuacct controller (the vm class's QEMU,
        # where cpu and cpuacct are separate hierarchies): its processes' own.
        seconds = int(usage.strip() or 0) / 1e9 if usage else _procs_cpu(memory / "cgroup.procs")
        inactive = _stat_value(stat, "total_inactive_file")
        kills = _stat_value(_read(memory / "memory.oom_control") or "", "oom_kill")
    charged = int(current.strip() or 0)
    return seconds, max(0, charged - inactive), kills


def _procs_cpu(procs: Path) -> float:
    """CPU seconds of the processes listed in ``procs`` (every thread's)."""
    total = 0
    for pid in (_read(procs) or "").split():
        stat = _read(Path(f"/proc/{pid}/stat"))
        if stat is not None:
            fields = stat.rpartition(")")[2].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / CLOCK_TICKS


def netns_bytes(pids: Callable[[], list[int]], netns: Path, hint: list[int]) -> tuple[int, int]:
    """Bytes in and out of the network namespace mounted at ``netns``, read
    through a process that lives in it ((0, 0) when none does). ``hint``
    holds the process found last time, tried first: listing ``pids`` walks
    the cgroup, the costliest step of a reading."""
    try:
        want = os.stat(netns).st_ino
    except OSError:
        return 0, 0
    for pid in [*hint, *(p for p in pids() if p not in hint)] if hint else pids():
        with contextlib.suppress(OSError, ValueError):
            if os.stat(f"/proc/{pid}/ns/net").st_ino == want:
                hint[:] = [pid]
                return net_dev_bytes(Path(f"/proc/{pid}/net/dev").read_text())
    return 0, 0


def filesystem_used(mount: Path) -> int:
    """Bytes in use on the filesystem mounted at ``mount`` (0 when unmounted)."""
    try:
        st = os.statvfs(mount)
    except OSError:
        return 0
    return (st.f_blocks - st.f_bfree) * st.f_frsize
