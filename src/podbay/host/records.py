"""Each machine's spec and last commanded state, on disk beside its storage.

``<data>/machines/<id>/machine.json`` is written atomically (temp + rename)
and is what :meth:`OciDriver.adopt` reads after the node process died: the
machine exists exactly when this file does. The *observed* state always
comes from the host (runc's state, the freezer), never from this file alone.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..domain.egress import EgressPolicy
from .machine import Limits, MachineSpec, MachineState, VolumeBind

RECORD = "machine.json"


@dataclass(frozen=True)
class MachineRecord:
    spec: MachineSpec
    #: What the driver was last asked for (running, suspended or stopped).
    commanded: MachineState
    #: Key of the base image the writable layer was made on: its files sit on top
    #: of that image, so the machine keeps it while it is cached ("" = current).
    image: str = ""

    def with_state(self, state: MachineState) -> MachineRecord:
        return replace(self, commanded=state)


def spec_to_json(spec: MachineSpec) -> dict[str, Any]:
    return {
        "machine_id": spec.machine_id,
        "hostname": spec.hostname,
        "limits": {
            "memory_bytes": spec.limits.memory_bytes,
            "cpus": spec.limits.cpus,
            "pids": spec.limits.pids,
            "disk_bytes": spec.limits.disk_bytes,
        },
        "env": dict(spec.env),
        "layers": [str(p) for p in spec.layers],
        "labels": dict(spec.labels),
        "egress": spec.egress.to_doc(),
        "volumes": [
            [str(v.source), v.destination, v.read_only, str(v.disk or "")] for v in spec.volumes
        ],
    }


def spec_from_json(raw: dict[str, Any]) -> MachineSpec:
    return MachineSpec(
        machine_id=raw["machine_id"],
        hostname=raw["hostname"],
        limits=Limits(**raw["limits"]),
        env=dict(raw.get("env") or {}),
        layers=tuple(Path(p) for p in raw.get("layers") or ()),
        labels=dict(raw.get("labels") or {}),
        egress=EgressPolicy.parse(raw.get("egress") or {}),
        volumes=tuple(
            VolumeBind(Path(v[0]), v[1], bool(v[2]), Path(v[3]) if len(v) > 3 and v[3] else None)
            for v in raw.get("volumes") or ()
        ),
    )


def write(directory: Path, record: MachineRecord) -> None:
    data = {
        "spec": spec_to_json(record.spec),
        "commanded": record.commanded.value,
        "image": record.image,
    }
    tmp = directory / f".{RECORD}.tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())
    os.rename(tmp, directory / RECORD)


def read(directory: Path) -> MachineRecord | None:
    try:
        raw = json.loads((directory / RECORD).read_text())
    except FileNotFoundError:
        return None
    return MachineRecord(
        spec_from_json(raw["spec"]), MachineState(raw["commanded"]), str(raw.get("image") or "")
    )
