"""The runtime-driver interface: what the control plane and gateway need of a machine.

A *machine* is the isolated computer behind one sandbox incarnation. The
control plane names it (``machine_id``) and decides what should exist; a
driver makes it so and reports what it observes. Nothing OCI-specific
belongs here, so that a VM or Kubernetes driver fits the same seam.

States a driver reports::

    absent ──create──► stopped ──start──► running ──suspend──► suspended
       ▲                  ▲  ◄──stop──────┘  ▲ ◄──resume────────┘
       └──destroy─────────┴──────────────────┴─────────(from any)

Every call is idempotent: repeating one that already took effect succeeds.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from podbay.domain.egress import EgressDestination, EgressPolicy
from podbay.errors import DriverError as DriverError  # re-exported: defined in the one tree
from podbay.errors import MachineNotFound as MachineNotFound
from podbay.host.machine import MACHINE_ID_PATTERN as MACHINE_ID_PATTERN
from podbay.host.machine import Limits as Limits
from podbay.host.machine import MachineSpec as MachineSpec
from podbay.host.machine import MachineState as MachineState
from podbay.host.machine import check_machine_id as check_machine_id

if TYPE_CHECKING:
    from .transfer import Received


@dataclass(frozen=True, kw_only=True)
class Capabilities:
    """What a driver can do, declared rather than discovered by failure."""

    suspend: bool  # freeze with memory intact
    stop_keeps_files: bool  # a stopped machine starts again with its files
    network: bool  # outbound internet
    #: A stopped machine's disk can be exported here and imported on another
    #: node (:class:`MovableDriver`), so it can carry over there.
    move: bool = False
    #: A machine's disk can be copied into new machines of this driver while
    #: it runs, is suspended or stopped (:class:`ForkingDriver`).
    fork: bool = False


@dataclass(frozen=True, kw_only=True)
class ObservedMachine:
    machine_id: str
    state: MachineState
    labels: Mapping[str, str]


@runtime_checkable
class Driver(Protocol):
    name: str
    capabilities: Capabilities

    @property
    def base_image(self) -> str:
        """What machines start from (e.g. the base image's recipe hash). A layer
        exported from a machine is only valid over the same base, so cached
        layers are keyed by it."""
        ...

    async def prepare(self) -> None:
        """Check the host and make the base image ready (built once, then cached)."""

    async def create(self, spec: MachineSpec) -> None:
        """Allocate the machine's storage; it is then ``stopped``."""

    async def start(self, machine_id: str) -> None:
        """Boot it; returns once the agent answers on :meth:`agent_socket`."""

    async def suspend(self, machine_id: str) -> None: ...

    async def resume(self, machine_id: str) -> None: ...

    async def stop(self, machine_id: str) -> None:
        """End every process and release compute; files stay."""

    async def destroy(self, machine_id: str) -> None:
        """Leave nothing behind: processes, mounts, cgroups, namespaces, files."""

    async def assign(self, machine_id: str, *, hostname: str, labels: Mapping[str, str]) -> None:
        """Give a machine (typically a ready one from a warm pool) its sandbox's
        hostname and labels, without restarting it."""

    async def state(self, machine_id: str) -> MachineState: ...

    async def set_egress(self, machine_id: str, egress: EgressPolicy) -> None:
        """Change where the machine may send packets: kept for every later start
        and, while it runs, in force when this returns."""

    async def egress_audit(self, machine_id: str) -> list[EgressDestination]:
        """The destinations the machine reached or was refused lately
        (docs/network.md, "Audit"); none while its network is down."""
        ...

    async def export_layer(self, machine_id: str, dest: Path) -> None:
        """Copy a stopped machine's own changes (its writable layer, deletions
        included) to ``dest``, ready to serve other machines as a read-only
        layer in :attr:`MachineSpec.layers`. How environments are cached."""

    def agent_socket(self, machine_id: str) -> Path:
        """Host path of a unix socket that reaches the machine's agent."""
        ...

    async def adopt(self) -> list[ObservedMachine]:
        """Every machine this driver's data directory holds, as it is now."""
        ...

    async def close(self) -> None:
        """Release the driver's own resources; machines keep running."""


@runtime_checkable
class MovableDriver(Protocol):
    """A driver whose stopped machines move between nodes (``capabilities.move``)."""

    def export_disk(self, machine_id: str) -> AsyncGenerator[bytes, None]:
        """A stopped machine's record and disk as a stream (:mod:`.transfer`)."""
        ...

    # The signature RecordKeepingDriver.import_disk implements, repeated as a
    # protocol must: what is asked of a driver stands here.
    async def import_disk(
        self,
        machine_id: str,
        chunks: AsyncIterator[bytes],
        *,
        layers: tuple[Path, ...],
        env: Mapping[str, str],
        room: Callable[[int], str | None] | None = None,
    ) -> Received:
        """The machine made here, stopped, from another node's export."""
        ...


@dataclass(frozen=True, kw_only=True)
class ForkCopy:
    """One new machine a fork makes: its own id, hostname and labels; the rest
    of its spec (limits, environment, layers, egress policy) is the source's."""

    machine_id: str
    hostname: str
    labels: Mapping[str, str]


@runtime_checkable
class ForkingDriver(Protocol):
    """A driver that copies a machine into new ones (``capabilities.fork``)."""

    async def fork(self, source_id: str, copies: Sequence[ForkCopy]) -> float:
        """Make each of ``copies`` here, stopped, with the files ``source_id``
        holds now: a running source is held still while its disk is copied
        (the seconds it was held are returned; 0 for a stopped one) and runs
        on after. Nothing of a copy is left when this raises."""
        ...
