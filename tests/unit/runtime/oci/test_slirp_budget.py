"""runtime.slirp_max_fds: the descriptor budget the OCI driver gives each
sandbox's slirp4netns, read from the environment and refused out of range."""

from __future__ import annotations

from pathlib import Path

import pytest

from podbay.runtime.base import DriverError
from podbay.runtime.network.slirp import MAX_FDS, MIN_FDS
from podbay.runtime.oci.driver import OciDriver
from podbay.settings import Settings


def driver(data_dir: Path, **environ: str) -> OciDriver:
    return OciDriver(Settings.load(environ=environ, data_dir=data_dir))


def test_each_slirp_gets_the_configured_budget(tmp_path: Path) -> None:
    default = driver(tmp_path).network.slirps.limits
    assert default is not None
    assert default.max_fds == 4096
    lowered = driver(tmp_path, PODBAY_RUNTIME_SLIRP_MAX_FDS="256").network.slirps.limits
    assert lowered is not None
    assert lowered.max_fds == 256
    assert lowered.memory_bytes < default.memory_bytes


#: What one held connection cost a flooded slirp4netns (28-34 KiB measured;
#: 128 MiB ended it at ~3,900 of its 4,096 descriptors).
MEASURED_BYTES_PER_CONNECTION = 34 * 1024


@pytest.mark.parametrize("max_fds", [MIN_FDS, 256, 4096, 65536])
def test_the_descriptor_cap_comes_before_the_memory_limit(tmp_path: Path, max_fds: int) -> None:
    # At the cap new connections fail and the open ones live on; at the memory
    # limit the kernel ends slirp4netns and the sandbox loses every connection.
    limits = driver(tmp_path, PODBAY_RUNTIME_SLIRP_MAX_FDS=str(max_fds)).network.slirps.limits
    assert limits is not None
    assert limits.memory_bytes > max_fds * MEASURED_BYTES_PER_CONNECTION + 16 * 1024 * 1024


@pytest.mark.parametrize("value", [MIN_FDS - 1, 0, -1, MAX_FDS + 1])
def test_a_budget_out_of_range_is_refused_naming_the_setting(tmp_path: Path, value: int) -> None:
    with pytest.raises(DriverError, match=f"runtime.slirp_max_fds must be .* not {value}"):
        driver(tmp_path, PODBAY_RUNTIME_SLIRP_MAX_FDS=str(value))


def test_the_bounds_themselves_are_accepted(tmp_path: Path) -> None:
    for value in (MIN_FDS, MAX_FDS):
        limits = driver(tmp_path, PODBAY_RUNTIME_SLIRP_MAX_FDS=str(value)).network.slirps.limits
        assert limits is not None
        assert limits.max_fds == value
