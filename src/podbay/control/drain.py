"""``podbay node drain``: a node takes no new sandboxes, and its stopped
sandboxes' disks move to other nodes, so it can be forgotten without losing
them.

What happens to each sandbox the node holds:

* **stopped**: moved now (node to node, SHA-256 checked at both ends, see
  :meth:`~.services.transitions.Transitions.relocate`) to a node that runs
  its class and has room; the next attach starts it there (``carried_over``).
* **running, suspended**: left as they are by default (an agent may be in the
  middle of a command; a suspended one resumes here with its memory). They
  leave on their own: at the age ceiling a sandbox is stopped and, its node
  being drained, moved at once; a suspended one is reclaimed after
  ``lifecycle.suspended_ttl_seconds``. With ``evict`` they are stopped now
  (their processes end, their files are kept, as at the ceiling) and moved.
* a **lost** node's sandboxes cannot be read: their records are given up
  (their next attach starts a new sandbox elsewhere).

The command drives the moves itself, from the operator's machine, with the
control plane's parts (the store's keys sign the disk passes; each sandbox
is held under its lease, so replicas never act on it meanwhile). The bytes go
from node to node.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from podbay.dataplane.metrics import Metrics
from podbay.domain import Sandbox, SandboxState
from podbay.errors import SandboxStays
from podbay.settings import Settings
from podbay.store.postgres import PostgresStore

from .keys import StoreKeyRing
from .plane import LeaseLocks
from .remote import ClusterNodes
from .services.transitions import Transitions

S = SandboxState


@dataclass
class Drained:
    """What a drain did, one entry per sandbox the node held."""

    found: bool = True
    lost: bool = False
    given_up: int = 0
    moved: list[dict[str, Any]] = field(default_factory=list)
    kept: list[dict[str, Any]] = field(default_factory=list)
    #: Sandboxes the drain was to move and could not (they are on the node still).
    failed: list[dict[str, Any]] = field(default_factory=list)


def _utcnow() -> datetime:
    return datetime.now(UTC)


async def drain(
    store: PostgresStore,
    settings: Settings,
    name: str,
    *,
    evict: bool = False,
    clock: Callable[[], datetime] = _utcnow,
) -> Drained:
    if not await store.drain_node(name):
        return Drained(found=False)
    lost_after = settings.cluster.node_lost_seconds
    records = {r.name: r for r in await store.list_nodes()}
    if records[name].lost(clock(), lost_after):
        return Drained(lost=True, given_up=await store.drop_node_sandboxes(name))
    keys = await StoreKeyRing.open(store, create=False)
    nodes = ClusterNodes(store, keys, lost_after=lost_after, clock=clock)
    locks = LeaseLocks(store, clock)
    max_age = timedelta(seconds=settings.lifecycle.max_age_seconds)
    transitions = Transitions(store, nodes, Metrics(), clock, max_age)
    done = Drained()
    try:
        await nodes.refresh(force=True)
        for stale in await store.list_sandboxes():
            if stale.node == name:
                await _one(stale, name, evict, nodes, locks, transitions, done)
    finally:
        await nodes.close()
    return done


async def _one(
    stale: Sandbox,
    name: str,
    evict: bool,
    nodes: ClusterNodes,
    locks: LeaseLocks,
    transitions: Transitions,
    done: Drained,
) -> None:
    async with locks.hold(stale.deployment_id, stale.name):
        row = await transitions.store.get_sandbox(stale.deployment_id, stale.name)
        if row is None or row.id != stale.id or row.node != name:
            return
        entry: dict[str, Any] = {"sandbox": row.id, "name": row.name, "state": row.state.value}
        if row.state in (S.RUNNING, S.SUSPENDED) and not evict:
            done.kept.append({**entry, "why": "still in use (drain --evict stops it)"})
        elif row.state not in (S.RUNNING, S.SUSPENDED, S.STOPPED):
            done.kept.append({**entry, "why": f"{row.state.value}: left to the lifecycle"})
        else:
            try:
                done.moved.append({**entry, **await _move_off(row, nodes, transitions)})
            except SandboxStays as stays:
                done.failed.append({**entry, "why": str(stays)})


async def _move_off(row: Sandbox, nodes: ClusterNodes, transitions: Transitions) -> dict[str, Any]:
    if row.state is not S.STOPPED:
        try:
            stopped = await transitions.stop(row, "drain --evict")
        except Exception as exc:  # noqa: BLE001 - reported per sandbox: the drain moves the others
            raise SandboxStays(f"could not stop it: {exc}") from None
        if stopped is None:
            raise SandboxStays("it changed meanwhile; drain again")
        row = stopped
    found = await nodes.relocation(row)
    if found is None:
        raise SandboxStays(f"no other node takes class {row.class_!r} machines now")
    started = time.monotonic()
    try:
        result = await transitions.relocate(row, "drain", found[0])
    except Exception as exc:  # noqa: BLE001 - reported per sandbox: the drain moves the others
        raise SandboxStays(f"the move failed: {exc}") from None
    if result is None:
        raise SandboxStays("it changed meanwhile; drain again")
    moved, received = result
    return {
        "to": moved.node,
        "bytes": received.bytes,
        "sha256": received.sha256,
        "seconds": round(time.monotonic() - started, 3),
    }
