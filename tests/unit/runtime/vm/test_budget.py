"""The ``vm`` class's host budget as its driver computes it: slirp4netns gets
``runtime.slirp_max_fds`` like the OCI classes', QEMU guest RAM plus its own share."""

from __future__ import annotations

from pathlib import Path

import pytest

from podbay.runtime.base import DriverError
from podbay.runtime.network.slirp import MAX_FDS
from podbay.runtime.vm.budget import QEMU_OVERHEAD_MIB, QEMU_OWN_FDS
from podbay.runtime.vm.driver import VmDriver
from podbay.settings import Settings
from podbay.testing.fixtures import small_spec


def driver(data_dir: Path, **environ: str) -> VmDriver:
    return VmDriver(Settings.load(environ=environ, data_dir=data_dir))


def test_slirp4netns_and_qemu_get_the_configured_budget(tmp_path: Path) -> None:
    vm = driver(tmp_path, PODBAY_RUNTIME_SLIRP_MAX_FDS="256")
    limits = vm.network.slirps.limits
    assert limits is not None
    assert limits.max_fds == 256
    assert limits.cgroup_parent != vm.cgroup_parent  # one cgroup per process
    budget = vm.qemu_budget(small_spec(memory_bytes=512 << 20))
    assert budget.memory_bytes == (512 + QEMU_OVERHEAD_MIB) << 20
    assert budget.max_fds == QEMU_OWN_FDS + 256
    assert budget.cpus == 1.0


def test_a_budget_out_of_range_is_refused_naming_the_setting(tmp_path: Path) -> None:
    with pytest.raises(DriverError, match=r"runtime\.slirp_max_fds must be"):
        driver(tmp_path, PODBAY_RUNTIME_SLIRP_MAX_FDS=str(MAX_FDS + 1))
