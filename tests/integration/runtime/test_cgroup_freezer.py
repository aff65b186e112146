"""The freezer code paths against the real kernel, v1 and v2.

This host is cgroup v1 (hybrid): the driver's v2 path is otherwise exercised
only on v2 hosts, so here it runs against the (controller-less) unified
hierarchy, where ``cgroup.freeze`` works all the same.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import uuid
from pathlib import Path

import pytest

from podbay.host.cgroups import ROOT, Cgroups
from podbay.testing.fixtures import host_cannot

pytestmark = pytest.mark.root


def v2_root() -> Path | None:
    for candidate in (ROOT, ROOT / "unified"):
        if (candidate / "cgroup.controllers").exists():
            return candidate
    return None


def ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime + stime


@pytest.mark.parametrize("version", [1, 2])
def test_freeze_and_thaw_a_busy_process(version: int) -> None:
    if os.geteuid() != 0:
        host_cannot("needs root")
    root = v2_root() if version == 2 else (ROOT if (ROOT / "freezer").is_dir() else None)
    if root is None:
        host_cannot(f"no cgroup v{version} freezer on this host")
    groups = Cgroups(root)
    assert groups.version == version
    path = f"/podbay-test-{uuid.uuid4().hex[:8]}"
    for d in groups.dirs(path) if version == 2 else [root / "freezer" / path.strip("/")]:
        d.mkdir(parents=True)
    procs = (
        root / path.strip("/") / "cgroup.procs"
        if version == 2
        else root / "freezer" / path.strip("/") / "cgroup.procs"
    )
    busy = subprocess.Popen(["sh", "-c", "while :; do :; done"])
    try:
        procs.write_text(str(busy.pid))
        asyncio.run(groups.freeze(path, within=5))
        assert groups.frozen(path)
        before = ticks(busy.pid)
        asyncio.run(asyncio.sleep(0.3))
        assert ticks(busy.pid) - before <= 1, "a frozen process kept running"
        groups.thaw(path)
        assert not groups.frozen(path)
        before = ticks(busy.pid)
        asyncio.run(asyncio.sleep(0.3))
        assert ticks(busy.pid) > before, "a thawed process did not run"
    finally:
        busy.kill()
        groups.thaw(path)
        busy.wait()
        groups.remove(path)
    assert not groups.existing(path)


@pytest.mark.parametrize("version", [1, 2])
def test_kill_ends_the_processes_of_a_frozen_cgroup(version: int) -> None:
    # A SIGKILL to a frozen process waits for a thaw that, for a cgroup whose
    # owner is gone (a node killed while its machine was suspended), never comes.
    if os.geteuid() != 0:
        host_cannot("needs root")
    root = v2_root() if version == 2 else (ROOT if (ROOT / "freezer").is_dir() else None)
    if root is None:
        host_cannot(f"no cgroup v{version} freezer on this host")
    groups = Cgroups(root)
    path = f"/podbay-test-{uuid.uuid4().hex[:8]}"
    top = root / path.strip("/") if version == 2 else root / "freezer" / path.strip("/")
    (top / "child").mkdir(parents=True)  # a frozen child of its own too
    busy = [subprocess.Popen(["sh", "-c", "while :; do :; done"]) for _ in range(2)]
    try:
        (top / "cgroup.procs").write_text(str(busy[0].pid))
        (top / "child" / "cgroup.procs").write_text(str(busy[1].pid))
        asyncio.run(groups.freeze(f"{path}/child", within=5))
        asyncio.run(groups.freeze(path, within=5))
        assert sorted(groups.kill(path)) == sorted(p.pid for p in busy)
        for process in busy:
            assert process.wait(5) == -9
        assert not groups.remove(path)
    finally:
        for process in busy:
            process.kill()
        for frozen in (f"{path}/child", path):
            with contextlib.suppress(Exception):
                groups.thaw(frozen)
        for process in busy:
            process.wait()
        groups.remove(path)
