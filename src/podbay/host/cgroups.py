"""Cgroup facts the driver needs beyond what runc does: freezing, leftovers, host checks.

Works on cgroup v2 (unified) and on v1, including the hybrid layout where
v1 controllers sit beside an empty unified hierarchy. runc creates and
limits the cgroup from ``config.json``; the driver freezes and thaws it by
writing the freezer directly, which costs microseconds where ``runc
pause``/``resume`` costs a process start (the resume budget is 20 ms), and
runc reads the same freezer state, so the two views never disagree.

>>> Cgroups(Path("/nonexistent")).version
1
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Callable
from pathlib import Path

from podbay.errors import DriverError

ROOT = Path("/sys/fs/cgroup")
V1_CONTROLLERS = ("memory", "pids", "cpu", "freezer")


class Cgroups:
    def __init__(self, root: Path = ROOT) -> None:
        self.root = root
        self.version = 2 if (root / "cgroup.controllers").exists() else 1

    # -- paths ---------------------------------------------------------------
    def dirs(self, path: str) -> list[Path]:
        """Every directory a cgroup path (``/podbay/x/m1``) has on this host."""
        rel = path.strip("/")
        if self.version == 2:
            return [self.root / rel]
        found = []
        for hierarchy in sorted(self.root.iterdir()):
            if hierarchy.is_symlink() or not hierarchy.is_dir():
                continue
            found.append(hierarchy / rel)
        return found

    def freezer_file(self, path: str) -> Path:
        rel = path.strip("/")
        if self.version == 2:
            return self.root / rel / "cgroup.freeze"
        return self.root / "freezer" / rel / "freezer.state"

    # -- freezing ------------------------------------------------------------
    def frozen(self, path: str) -> bool:
        try:
            value = self.freezer_file(path).read_text().strip()
        except FileNotFoundError:
            return False
        return value in ("1", "FROZEN", "FREEZING")

    async def freeze(self, path: str, within: float = 10.0) -> None:
        """Freeze every process of the cgroup; returns once they are all frozen."""
        file = self.freezer_file(path)
        self._write(file, "1" if self.version == 2 else "FROZEN")
        deadline = asyncio.get_running_loop().time() + within
        delay = 0.0005
        while not self._settled_frozen(path):
            if asyncio.get_running_loop().time() > deadline:
                self._write(file, "0" if self.version == 2 else "THAWED")
                raise DriverError(f"cgroup {path} did not freeze within {within:.0f} s")
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.05)
            if self.version == 1:  # v1 retries the freeze on each write
                self._write(file, "FROZEN")

    def _settled_frozen(self, path: str) -> bool:
        if self.version == 2:
            events = (self.root / path.strip("/") / "cgroup.events").read_text()
            return "frozen 1" in events
        return self.freezer_file(path).read_text().strip() == "FROZEN"

    def thaw(self, path: str) -> None:
        self._write(self.freezer_file(path), "0" if self.version == 2 else "THAWED")

    def thaw_if_frozen(self, path: str) -> bool:
        """Thaw the cgroup when it is frozen; whether it was."""
        if not self.frozen(path):
            return False
        self.thaw(path)
        return True

    @staticmethod
    def _write(file: Path, value: str) -> None:
        try:
            fd = os.open(file, os.O_WRONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise DriverError(f"no cgroup at {file.parent}") from None
        try:
            os.write(fd, value.encode())
        finally:
            os.close(fd)

    # -- a process of our own under limits ------------------------------------
    def confine(self, path: str, pid: int, *, memory_bytes: int, pids: int, cpus: float) -> None:
        """Make the cgroup ``path`` with these limits and move ``pid`` into it (for
        helpers podbay starts itself; runc makes the sandboxes' own)."""
        for procs in self.limit(path, memory_bytes=memory_bytes, pids=pids, cpus=cpus):
            self._write(procs, str(pid))

    def limit(self, path: str, *, memory_bytes: int, pids: int, cpus: float) -> list[Path]:
        """Make the cgroup ``path`` with these limits; its ``cgroup.procs`` files
        (one per hierarchy): a process that writes its pid to each starts inside."""
        quota = max(1000, int(cpus * 100_000))
        rel = path.strip("/")
        if self.version == 2:
            parts = rel.split("/")
            for depth in range(len(parts)):
                parent = self.root.joinpath(*parts[:depth])
                (parent / parts[depth]).mkdir(exist_ok=True)
                with contextlib.suppress(OSError):  # already on, or not ours to change
                    self._write(parent / "cgroup.subtree_control", "+memory +pids +cpu")
            target = self.root / rel
            limits = {
                "memory.max": str(memory_bytes),
                "memory.swap.max": "0",
                "pids.max": str(pids),
                "cpu.max": f"{quota} 100000",
            }
            for name, value in limits.items():
                if (target / name).exists():
                    self._write(target / name, value)
            return [target / "cgroup.procs"]
        v1 = {
            "memory": {"memory.limit_in_bytes": str(memory_bytes)},
            "pids": {"pids.max": str(pids)},
            "cpu": {"cpu.cfs_period_us": "100000", "cpu.cfs_quota_us": str(quota)},
        }
        procs = []
        for controller, limits in v1.items():
            target = self.root / controller / rel
            target.mkdir(parents=True, exist_ok=True)
            for name, value in limits.items():
                self._write(target / name, value)
            procs.append(target / "cgroup.procs")
        return procs

    def cap_pids(self, path: str, limit: int) -> None:
        """Set ``pids.max`` of the cgroup ``path`` (made if missing): on the
        parent of every sandbox, it bounds them all together (:func:`node_pids`)."""
        rel = path.strip("/")
        if self.version == 2:
            with contextlib.suppress(OSError):  # already on, or not ours to change
                self._write(self.root / "cgroup.subtree_control", "+pids")
            target = self.root / rel
        else:
            target = self.root / "pids" / rel
        target.mkdir(parents=True, exist_ok=True)
        self._write(target / "pids.max", str(limit))

    # -- leftovers -----------------------------------------------------------
    def existing(self, path: str) -> list[Path]:
        return [d for d in self.dirs(path) if d.is_dir()]

    def remove(self, path: str) -> list[Path]:
        """Remove the cgroup (and empty children) everywhere; the dirs that stayed."""
        stayed = []
        for top in self.existing(path):
            for dirpath, _, _ in sorted(os.walk(top), key=lambda e: -len(e[0])):
                with contextlib.suppress(OSError):
                    os.rmdir(dirpath)
            if top.exists():
                stayed.append(top)
        return stayed

    def remove_children(self, parent: str, keep: Callable[[str], bool]) -> list[str]:
        """Remove each child cgroup of ``parent`` that ``keep`` (given its name)
        refuses, where empty; one ``removed cgroup DIR`` line per directory gone."""
        removed = []
        for directory in self.existing(parent):
            for child in sorted(p for p in directory.iterdir() if p.is_dir()):
                if not keep(child.name) and not self.remove(f"{parent}/{child.name}"):
                    removed.append(f"removed cgroup {child}")
        return removed

    def kill(self, path: str) -> list[int]:
        """SIGKILL every process of the cgroup and its children, each cgroup
        thawed first: a process of a frozen cgroup takes no signal until it is
        thawed, and nothing thaws a cgroup whose owner is gone (a node killed
        while the machine was suspended). The pids signalled."""
        rel = path.strip("/")
        top = self.root / rel if self.version == 2 else self.root / "freezer" / rel
        if top.is_dir():
            base = top.parents[len(Path(rel).parts) - 1]
            for directory in [top, *(p for p in top.rglob("*") if p.is_dir())]:
                with contextlib.suppress(DriverError, OSError):  # gone meanwhile
                    self.thaw_if_frozen("/" + str(directory.relative_to(base)))
        pids = self.procs(path)
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return pids

    def procs(self, path: str) -> list[int]:
        pids: set[int] = set()
        for d in self.existing(path):
            for dirpath, _, files in os.walk(d):
                if "cgroup.procs" in files:
                    with contextlib.suppress(OSError):
                        text = Path(dirpath, "cgroup.procs").read_text()
                        pids.update(int(x) for x in text.split())
        return sorted(pids)

    # -- host checks ---------------------------------------------------------
    def missing_controllers(self) -> list[str]:
        """Controllers podbay needs that this host lacks (empty when all present)."""
        if self.version == 2:
            try:
                have = set((self.root / "cgroup.controllers").read_text().split())
            except OSError:
                have = set()
            return [c for c in ("memory", "pids", "cpu") if c not in have]
        missing = [c for c in V1_CONTROLLERS if not (self.root / c).is_dir()]
        return missing

    def swap_accounting(self) -> bool:
        """Whether a swap limit can be set (so that memory limits are not swap-padded)."""
        if self.version == 1:
            return (self.root / "memory" / "memory.memsw.limit_in_bytes").exists()
        try:
            own = Path("/proc/self/cgroup").read_text().split("::", 1)[1].strip()
        except (OSError, IndexError):
            return False
        return (self.root / own.lstrip("/") / "memory.swap.max").exists()


#: Host pids no sandbox may take: at least this many, or an eighth of ``pid_max``.
HOST_PIDS_RESERVE = 4096


def node_pids(pid_max: int | None = None) -> int:
    """The pids all sandboxes of a node may hold together (host threads of gVisor's
    included, see ``runsc.host_pids``): ``kernel.pid_max`` but the host's reserve,
    so that sandboxes at their limits at once cannot leave the host without pids.

    >>> node_pids(32768)
    28672
    """
    if pid_max is None:
        pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    return pid_max - max(HOST_PIDS_RESERVE, pid_max // 8)
