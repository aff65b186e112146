"""The driver interface's own rules: machine ids are host path and cgroup components."""

from __future__ import annotations

import pytest

from podbay.runtime.base import Limits, MachineSpec, check_machine_id

LIMITS = Limits(memory_bytes=1, cpus=1.0, pids=1, disk_bytes=1)


@pytest.mark.parametrize("machine_id", ["m", "0abc", "sbx-1-2", "a" * 63])
def test_dull_ids_pass(machine_id: str) -> None:
    assert check_machine_id(machine_id) == machine_id


@pytest.mark.parametrize(
    "machine_id",
    [
        "",
        "a" * 64,
        "-leading-dash",
        "Upper",
        "dot.ted",
        "../escape",
        "a/b",
        "a b",
        "é",
        "a\n",
        "a\x00",
    ],
)
def test_anything_that_could_escape_a_path_or_cgroup_is_refused(machine_id: str) -> None:
    with pytest.raises(ValueError, match="invalid machine id"):
        check_machine_id(machine_id)


def test_a_spec_cannot_be_made_with_a_bad_id() -> None:
    with pytest.raises(ValueError, match="invalid machine id"):
        MachineSpec(machine_id="../x", hostname="h", limits=LIMITS)
    spec = MachineSpec(machine_id="ok-1", hostname="h", limits=LIMITS)
    assert (spec.env, spec.layers, spec.labels) == ({}, (), {})
