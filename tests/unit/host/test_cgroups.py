"""Freezing and leftovers, on fake cgroup trees of both layouts (v1 and v2)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from podbay.errors import DriverError
from podbay.host.cgroups import Cgroups


def v1_tree(root: Path) -> Cgroups:
    for controller in ("memory", "pids", "cpu", "freezer"):
        (root / controller / "podbay/m1").mkdir(parents=True)
    (root / "freezer/podbay/m1/freezer.state").write_text("THAWED\n")
    (root / "unified").mkdir()  # the hybrid layout's empty v2 hierarchy
    return Cgroups(root)


def v2_tree(root: Path) -> Cgroups:
    (root / "podbay/m1").mkdir(parents=True)
    (root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (root / "podbay/m1/cgroup.freeze").write_text("0\n")
    (root / "podbay/m1/cgroup.events").write_text("populated 1\nfrozen 0\n")
    return Cgroups(root)


def freeze(groups: Cgroups, path: str, within: float = 0.2) -> None:
    asyncio.run(groups.freeze(path, within=within))


def test_the_version_is_read_from_the_tree(tmp_path: Path) -> None:
    assert v1_tree(tmp_path / "a").version == 1
    assert v2_tree(tmp_path / "b").version == 2


def test_v1_freeze_and_thaw_write_the_freezer(tmp_path: Path) -> None:
    groups = v1_tree(tmp_path)
    state = tmp_path / "freezer/podbay/m1/freezer.state"
    assert not groups.frozen("/podbay/m1")
    freeze(groups, "/podbay/m1")
    assert state.read_text().strip() == "FROZEN"
    assert groups.frozen("/podbay/m1")
    groups.thaw("/podbay/m1")
    assert state.read_text().strip() == "THAWED"
    assert not groups.frozen("/podbay/m1")


def test_v2_freeze_waits_for_the_kernel_to_report_frozen(tmp_path: Path) -> None:
    groups = v2_tree(tmp_path)
    events = tmp_path / "podbay/m1/cgroup.events"
    # The kernel never reports this fake cgroup frozen: freeze gives up and thaws,
    # so a half-frozen machine is never left behind.
    with pytest.raises(DriverError, match="did not freeze"):
        freeze(groups, "/podbay/m1")
    assert not groups.frozen("/podbay/m1")
    events.write_text("populated 1\nfrozen 1\n")
    freeze(groups, "/podbay/m1")
    assert groups.frozen("/podbay/m1")
    groups.thaw("/podbay/m1")
    assert (tmp_path / "podbay/m1/cgroup.freeze").read_text().strip() == "0"


def test_a_missing_cgroup_is_not_frozen_and_cannot_be_frozen(tmp_path: Path) -> None:
    groups = v2_tree(tmp_path)
    assert not groups.frozen("/podbay/gone")
    with pytest.raises(DriverError, match="no cgroup at"):
        freeze(groups, "/podbay/gone")


def test_v1_paths_span_every_real_hierarchy(tmp_path: Path) -> None:
    groups = v1_tree(tmp_path)
    (tmp_path / "cpuacct").symlink_to(tmp_path / "cpu")  # v1's aliases are links
    dirs = groups.dirs("/podbay/m1")
    assert dirs == sorted(
        tmp_path / h / "podbay/m1" for h in ("cpu", "freezer", "memory", "pids", "unified")
    )
    assert set(groups.existing("/podbay/m1")) == {
        tmp_path / h / "podbay/m1" for h in ("cpu", "freezer", "memory", "pids")
    }


def test_leftover_processes_and_removal(tmp_path: Path) -> None:
    groups = v1_tree(tmp_path)
    (tmp_path / "pids/podbay/m1/cgroup.procs").write_text("12\n34\n")
    (tmp_path / "memory/podbay/m1/child").mkdir()
    (tmp_path / "memory/podbay/m1/child/cgroup.procs").write_text("34\n56\n")
    assert groups.procs("/podbay/m1") == [12, 34, 56]
    # A fake tree's files make its directories non-empty, like a live cgroup's processes.
    stayed = groups.remove("/podbay/m1")
    assert set(stayed) == {tmp_path / h / "podbay/m1" for h in ("freezer", "memory", "pids")}
    assert not (tmp_path / "cpu/podbay/m1").exists()


def test_missing_controllers(tmp_path: Path) -> None:
    assert v1_tree(tmp_path / "v1").missing_controllers() == []
    (tmp_path / "bare").mkdir()
    assert Cgroups(tmp_path / "bare").missing_controllers() == ["memory", "pids", "cpu", "freezer"]
    v2 = v2_tree(tmp_path / "v2")
    assert v2.missing_controllers() == []
    (tmp_path / "v2/cgroup.controllers").write_text("cpu io\n")
    assert v2.missing_controllers() == ["memory", "pids"]


def test_v1_swap_accounting_is_the_memsw_file(tmp_path: Path) -> None:
    groups = v1_tree(tmp_path)
    assert not groups.swap_accounting()
    (tmp_path / "memory/memory.memsw.limit_in_bytes").write_text("-1\n")
    assert groups.swap_accounting()
