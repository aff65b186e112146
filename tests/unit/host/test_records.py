"""machine.json: what a restarted driver adopts, so it must read back exactly what was written."""

from __future__ import annotations

import json
from pathlib import Path

from podbay.domain.egress import EgressPolicy
from podbay.host import records
from podbay.runtime.base import Limits, MachineSpec, MachineState

SPEC = MachineSpec(
    machine_id="m1",
    hostname="thread-1",
    env={"A": "1", "B": "two words"},
    limits=Limits(memory_bytes=1 << 30, cpus=0.5, pids=64, disk_bytes=2 << 30),
    layers=(Path("/layers/l1"), Path("/layers/l2")),
    labels={"sandbox": "x"},
    egress=EgressPolicy.parse({"allow": ["pypi.org", "203.0.113.0/24"], "deny": ["192.0.2.1"]}),
)


def test_round_trip(tmp_path: Path) -> None:
    record = records.MachineRecord(SPEC, MachineState.SUSPENDED, "abc123")
    records.write(tmp_path, record)
    assert records.read(tmp_path) == record


def test_no_file_is_no_machine(tmp_path: Path) -> None:
    assert records.read(tmp_path) is None
    assert records.read(tmp_path / "never-created") is None


def test_a_rewrite_replaces_the_file_and_leaves_no_temporary(tmp_path: Path) -> None:
    records.write(tmp_path, records.MachineRecord(SPEC, MachineState.RUNNING))
    stopped = records.read(tmp_path)
    assert stopped is not None
    records.write(tmp_path, stopped.with_state(MachineState.STOPPED))
    back = records.read(tmp_path)
    assert back is not None
    assert back.commanded is MachineState.STOPPED
    assert back.spec == SPEC
    assert back.image == ""
    assert sorted(p.name for p in tmp_path.iterdir()) == [records.RECORD]


def test_with_state_changes_only_the_state() -> None:
    record = records.MachineRecord(SPEC, MachineState.RUNNING, "img")
    stopped = record.with_state(MachineState.STOPPED)
    assert (stopped.spec, stopped.image, stopped.commanded) == (SPEC, "img", MachineState.STOPPED)
    assert record.commanded is MachineState.RUNNING


def test_the_file_is_plain_json_with_the_whole_spec(tmp_path: Path) -> None:
    records.write(tmp_path, records.MachineRecord(SPEC, MachineState.RUNNING, "img"))
    raw = json.loads((tmp_path / records.RECORD).read_text())
    assert raw == {"spec": records.spec_to_json(SPEC), "commanded": "running", "image": "img"}
    assert raw["spec"]["layers"] == ["/layers/l1", "/layers/l2"]
    assert records.spec_from_json(raw["spec"]) == SPEC


def test_records_written_before_optional_fields_existed_still_read(tmp_path: Path) -> None:
    spec = records.spec_to_json(SPEC)
    for optional in ("env", "layers", "labels"):
        del spec[optional]
    (tmp_path / records.RECORD).write_text(json.dumps({"spec": spec, "commanded": "stopped"}))
    back = records.read(tmp_path)
    assert back is not None
    assert (back.spec.env, back.spec.layers, back.spec.labels, back.image) == ({}, (), {}, "")
    assert back.spec.limits == SPEC.limits


def test_a_record_written_before_egress_policies_reads_as_open(tmp_path: Path) -> None:
    records.write(tmp_path, records.MachineRecord(SPEC, MachineState.STOPPED))
    raw = json.loads((tmp_path / records.RECORD).read_text())
    assert raw["spec"]["egress"]["deny"] == ["192.0.2.1/32"]
    del raw["spec"]["egress"]
    (tmp_path / records.RECORD).write_text(json.dumps(raw))
    back = records.read(tmp_path)
    assert back is not None
    assert back.spec.egress == EgressPolicy()
