"""How the control plane talks to the nodes that hold machines: one interface.

The control plane decides what should exist (the store); a *node* holds the
machines, the warm pool, the declared environments' layers and the gateway
that serves their data plane. Everything the control plane asks of a node
goes through :class:`Node`: machines (launch, suspend, resume, stop,
destroy, state, adopt), the gateway's routes (publish before a sandbox is
reachable, withdraw before it stops being so), activity for the idle timer,
and capacity. :class:`Nodes` is the set of them: which node holds a sandbox,
where a new one goes, and what the classes mean across them.

Two implementations: :class:`podbay.node.local.LocalNode` in process (``podbay
serve``: the calls are plain method calls, nothing is serialized) and
:class:`podbay.control.remote.RemoteNode` over the node's internal HTTP API
(``podbay control`` with ``podbay node``). The control plane imports neither
the node, the gateway nor a driver: the composition root above them
(:mod:`podbay.serve`) picks the implementation. What a node is ordered to
make (:class:`~podbay.dataplane.orders.Launch`,
:class:`~podbay.dataplane.orders.Transfer`) lies below both planes.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Protocol

from podbay.dataplane.classes import ClassRuntimes
from podbay.dataplane.environment_seam import Building, Prepared
from podbay.dataplane.orders import Launch, Transfer
from podbay.domain import Deployment, Sandbox
from podbay.domain.egress import EgressDestination, EgressPolicy
from podbay.runtime.base import ForkCopy, MachineState, ObservedMachine
from podbay.runtime.transfer import Received
from podbay.wire.observe import CommandEntry, MetricSample


class Node(Protocol):
    """One sandbox host as the control plane sees it. Machines are named by
    ``(class, machine id)``; the node's driver of that class holds them."""

    #: Stable name (``serve``: ``local``); sandbox rows record it.
    name: str
    #: Whether :meth:`publish` returns a mark for the row's ``routed_on`` (a
    #: remote node), so a withdrawal has a mark to clear; an in-process node's
    #: :meth:`routed` reads its route table and never writes nor reads one.
    marks_routes: bool

    def endpoint(self, sandbox_id: str) -> str:
        """Absolute data-plane base URL of a sandbox this node holds."""
        ...

    def share_base(self) -> str:
        """Base URL share links of this node's sandboxes start with."""
        ...

    # -- capacity -----------------------------------------------------------------
    async def shortfall(self) -> str | None:
        """Why no new machine may be made here now (e.g. its disk reserve), or None."""
        ...

    def can_suspend(self, class_: str) -> bool: ...

    def can_fork(self, class_: str) -> bool:
        """Whether the driver of ``class_`` here copies machines (a fork)."""
        ...

    # -- machines ----------------------------------------------------------------------
    async def prepare(self, deployment: Deployment, class_: str) -> Prepared | Building:
        """The declared environment's layers on this node (built once), or "building"."""
        ...

    async def take_warm(self, class_: str, prepared: Prepared) -> str | None:
        """A ready machine of the warm pool for this environment, or None."""
        ...

    async def give_back(self, class_: str, prepared: Prepared, machine_id: str) -> None: ...

    async def launch(self, order: Launch, prepared: Prepared, deployment: Deployment) -> None:
        """Make ``order.machine_id`` run as the new sandbox (a pooled one is given
        its hostname and labels; otherwise created and started), then apply the
        environment's setup. Raises ApiError for the contract's refusals."""
        ...

    async def start(self, class_: str, machine_id: str) -> None: ...

    async def suspend(self, class_: str, machine_id: str) -> None: ...

    async def resume(self, class_: str, machine_id: str) -> None: ...

    async def stop(self, class_: str, machine_id: str) -> None: ...

    async def destroy(self, class_: str, machine_id: str) -> None: ...

    async def state(self, class_: str, machine_id: str) -> MachineState: ...

    async def fork(self, class_: str, source_id: str, copies: list[ForkCopy]) -> float:
        """Make each of ``copies`` on this node, stopped, with the files of
        machine ``source_id`` now (its driver's :meth:`fork`); the seconds a
        running source was held still. Raises ApiError
        ``SANDBOX_FORK_UNSUPPORTED`` when the class's driver cannot copy."""
        ...

    async def set_egress(self, class_: str, machine_id: str, egress: EgressPolicy) -> None:
        """Change where the machine may send packets: recorded for its later
        starts and, while it runs, in force when this returns."""
        ...

    async def egress_audit(self, class_: str, machine_id: str) -> list[EgressDestination]:
        """The machine's egress audit (docs/network.md, "Audit"); none while
        its network is down."""
        ...

    async def adopt(self) -> dict[str, list[ObservedMachine]]:
        """Every machine of every running class, as it is now."""
        ...

    async def receive(self, transfer: Transfer, prepared: Prepared) -> Received:
        """Fetch a stopped machine's disk from the node holding it (node to
        node) and make it here, stopped, over this node's ``prepared`` build
        of its environment. Raises (leaving nothing) when it cannot."""
        ...

    # -- the gateway's routes ----------------------------------------------------------
    async def publish(self, sandbox: Sandbox) -> str | None:
        """Route data-plane calls for this incarnation to its machine. Returns
        what the caller records in ``routed_on`` for :meth:`routed` to compare
        (a remote node: the boot id of the process that took the route), or
        None when :meth:`routed` asks the route table itself (in process)."""
        ...

    async def withdraw(self, sandbox_id: str) -> None:
        """Refuse data-plane calls for the sandbox from now on."""
        ...

    def routed(self, sandbox: Sandbox) -> bool:
        """Whether this incarnation's route is published (best knowledge; False
        when unsure: publishing again is idempotent)."""
        ...

    # -- observation ---------------------------------------------------------------------
    async def metrics(self, sandbox_id: str, since: datetime | None) -> list[MetricSample]:
        """The sandbox's metrics samples this node keeps, oldest first (after ``since``)."""
        ...

    async def latest_metrics(self) -> dict[str, MetricSample]:
        """The newest sample of each sandbox this node samples now, by sandbox
        id: one call per node for a whole list, never one per sandbox."""
        ...

    async def new_oom_kills(self) -> dict[str, tuple[datetime, int]]:
        """OOM kills in this node's sandboxes since the last call: sandbox id →
        (when the last was seen, how many)."""
        ...

    async def commands(self, sandbox: Sandbox) -> list[CommandEntry]:
        """The sandbox's command log (its machine's current boot), oldest first."""
        ...

    # -- activity ------------------------------------------------------------------------
    def touch(self, sandbox_id: str) -> None:
        """Count an attach as activity."""
        ...

    def last_seen(self, sandbox_id: str) -> datetime | None: ...

    def busy(self, sandbox_id: str) -> bool:
        """A data-plane request to it is in flight (never idle then)."""
        ...

    async def drain_activity(self) -> dict[str, datetime]:
        """Activity since the last drain (``sandbox id → last seen``)."""
        ...

    def restore_activity(self, seen: Mapping[str, datetime]) -> None:
        """Put back what a failed flush drained."""
        ...


class Nodes(Protocol):
    """Every node the control plane knows, and the class questions across them."""

    def of(self, sandbox: Sandbox) -> Node:
        """The node that holds ``sandbox``; raises ApiError when it cannot be reached."""
        ...

    async def place(self, class_: str) -> Node:
        """A node with room for a new sandbox of ``class_``; raises ApiError when none."""
        ...

    def all(self) -> list[Node]: ...

    def reachable(self, sandbox: Sandbox) -> bool:
        """Whether the node holding ``sandbox`` answers (False: it is lost)."""
        ...

    async def refresh(self) -> None:
        """Catch up with nodes enrolled, drained or lost since the last look."""
        ...

    def resolve(self, requested: str) -> str:
        """The class a new sandbox asked for as ``requested`` gets (ApiError if none)."""
        ...

    def require(self, class_: str) -> str:
        """``class_`` if some node runs it now, else ApiError naming what runs."""
        ...

    def works(self, class_: str) -> bool: ...

    async def relocation(self, sandbox: Sandbox) -> tuple[Node, str] | None:
        """Where a stopped sandbox should carry over to instead of its own node,
        and why (its node is drained or full), or None: it stays."""
        ...

    def transfer(self, source: Node, target: Node, class_: str, machine_id: str) -> Transfer:
        """A disk pass for ``target`` to fetch the machine from ``source``."""
        ...


class OneNode:
    """The all-in-one server's set: one node, whose classes are the server's."""

    def __init__(self, node: Node, classes: ClassRuntimes) -> None:
        self.node = node
        self.classes = classes

    def of(self, sandbox: Sandbox) -> Node:
        return self.node

    async def place(self, class_: str) -> Node:
        return self.node

    def all(self) -> list[Node]:
        return [self.node]

    def reachable(self, sandbox: Sandbox) -> bool:
        return True

    async def refresh(self) -> None:
        return None

    def resolve(self, requested: str) -> str:
        return self.classes.resolve(requested)

    def require(self, class_: str) -> str:
        return self.classes.require(class_)

    def works(self, class_: str) -> bool:
        return self.classes.works(class_)

    async def relocation(self, sandbox: Sandbox) -> tuple[Node, str] | None:
        return None  # one node: there is nowhere else

    def transfer(self, source: Node, target: Node, class_: str, machine_id: str) -> Transfer:
        raise ValueError("a single node moves nothing")
