"""What a machine is on this host: its id, its limits, its spec, its states.

The records on disk (:mod:`.records`), the drivers and the control plane's
seam (:mod:`podbay.runtime.base`) all speak of machines in these terms; they
live at the bottom so that the host library needs nothing of the runtime.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING

from ..domain.egress import OPEN, EgressPolicy

if TYPE_CHECKING:
    from ..settings import RuntimeSettings

#: Machine ids are host path and cgroup components: keep them dull.
MACHINE_ID_PATTERN = r"^[a-z0-9][a-z0-9-]{0,62}$"
_MACHINE_ID = re.compile(MACHINE_ID_PATTERN)


def check_machine_id(machine_id: str) -> str:
    if not _MACHINE_ID.fullmatch(machine_id):
        raise ValueError(f"invalid machine id {machine_id!r}")
    return machine_id


class MachineState(StrEnum):
    ABSENT = "absent"  # nothing of it exists
    STOPPED = "stopped"  # files kept, nothing runs
    RUNNING = "running"  # the agent answers
    SUSPENDED = "suspended"  # every process frozen, memory and files intact


@dataclass(frozen=True, kw_only=True)
class Limits:
    memory_bytes: int
    cpus: float
    pids: int
    disk_bytes: int

    @classmethod
    def of(cls, rt: RuntimeSettings) -> Limits:
        """A sandbox's default limits: the operator's runtime settings."""
        return cls(
            memory_bytes=rt.memory_bytes, cpus=rt.cpus, pids=rt.pids, disk_bytes=rt.disk_bytes
        )


@dataclass(frozen=True)
class VolumeBind:
    """A volume's directory on this host (:mod:`.volumes`), bound at
    ``destination`` (absolute) in the machine, writable unless ``read_only``."""

    source: Path
    destination: str
    read_only: bool = False
    #: The volume's filesystem file: mounted again where a reboot emptied
    #: ``source``'s mount point (:func:`podbay.host.volumes.remount`).
    disk: Path | None = None


@dataclass(frozen=True, kw_only=True)
class MachineSpec:
    """What to build. Stored by the driver with the machine, so a restart can adopt it."""

    machine_id: str
    hostname: str
    limits: Limits
    #: Set for every command the agent runs (the sandbox section's ``env``).
    env: Mapping[str, str] = field(default_factory=dict)
    #: Read-only layers above the base image, lowest first (prepared environments).
    layers: tuple[Path, ...] = ()
    #: Opaque to the driver; returned by :meth:`Driver.adopt`.
    labels: Mapping[str, str] = field(default_factory=dict)
    #: Where the sandbox may send packets: in its rules from its first packet on,
    #: at every start (``set_egress`` changes it, running or not).
    egress: EgressPolicy = OPEN
    #: Volumes bound into it at every start (docs/volumes.md).
    volumes: tuple[VolumeBind, ...] = ()
    #: Its hostname comes later, through :meth:`Driver.assign` (a warm pool's
    #: machine): a driver may get ready for that while it waits. Not stored.
    named_later: bool = False

    def __post_init__(self) -> None:
        check_machine_id(self.machine_id)
