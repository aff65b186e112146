"""A suspended gVisor machine of a node killed with SIGKILL is gone after the
cleanup the test servers run (:func:`podbay.testing.fixtures.cleanup`, which is
``podbay gc --all`` per class): a process of a frozen cgroup v1 freezer takes
no SIGKILL until it is thawed, so every path that kills one thaws first."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import time
from pathlib import Path

import pytest

from podbay.host.cgroups import Cgroups
from podbay.host.layout import Layout
from podbay.runtime.classes import GVISOR, class_settings
from podbay.testing.driver_conformance import node_killed_once_ready
from podbay.testing.fixtures import (
    cleanup,
    host_cannot,
    require_host,
    sandbox_settings,
    small_spec,
)

pytestmark = pytest.mark.root


def processes_in(layout: Layout) -> list[int]:
    """Every process whose cgroup is under this data directory's cgroup parent."""
    marker = f"{layout.cgroup_parent}/".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if marker in (entry / "cgroup").read_bytes():
                    found.append(int(entry.name))
    return found


def cgroup_dirs(cgroups: Cgroups, layout: Layout) -> list[str]:
    return sorted(
        str(p)
        for top in cgroups.existing(layout.cgroup_parent)
        for p in [top, *top.rglob("*")]
        if p.is_dir()
    )


def gone(layout: Layout, within: float = 15.0) -> list[int]:
    """The processes left once killed ones have exited (they take a moment)."""
    deadline = time.monotonic() + within
    while (left := processes_in(layout)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def suspended_by_a_killed_node(settings: object, spec: object) -> None:
    """A node process starts the machine, suspends it, and is killed with SIGKILL."""
    node_killed_once_ready("podbay.runtime.oci.driver:OciDriver", settings, {"suspended": spec})


@pytest.mark.parametrize("data_dir_removed", [False, True], ids=["kept", "removed"])
def test_a_frozen_gvisor_machine_of_a_killed_node_leaves_nothing(
    tmp_path: Path, data_dir_removed: bool
) -> None:
    # ``removed``: a killed test session's data directory that pytest's own
    # tmp_path retention deleted before the next session swept it
    # (fixtures.sweep_dead_sessions): the run directory and cgroups remain.
    require_host()
    if shutil.which("runsc") is None:
        host_cannot("needs runsc (gVisor)")
    settings = sandbox_settings(tmp_path / "data")
    gvisor = class_settings(settings, GVISOR)
    layout = Layout.from_settings(gvisor)
    cgroups = Cgroups()
    spec = small_spec()
    try:
        suspended_by_a_killed_node(gvisor, spec)
        assert cgroups.frozen(layout.machine(spec.machine_id).cgroup)
        assert processes_in(layout), "the suspended sandbox's processes"
        if data_dir_removed:
            shutil.rmtree(settings.data_dir)
        cleanup(settings)
        assert gone(layout) == []
        assert cgroup_dirs(cgroups, layout) == []
    finally:
        # Whatever the cleanup left must not outlive the test: thawed, then killed.
        for top in cgroups.existing(layout.cgroup_parent):
            for directory in sorted(top.rglob("*"), key=lambda p: -len(p.parts)):
                with contextlib.suppress(Exception):
                    cgroups.thaw(f"{layout.cgroup_parent}/{directory.relative_to(top)}")
        for pid in processes_in(layout):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        gone(layout)
        cgroups.remove(layout.cgroup_parent)
        shutil.rmtree(gvisor.runtime.run_dir, ignore_errors=True)
        shutil.rmtree(settings.runtime.run_dir, ignore_errors=True)
