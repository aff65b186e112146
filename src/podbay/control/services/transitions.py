"""Moving one sandbox between states: its node's machine, the node's gateway
route and the store in a fixed order. Callers hold the sandbox's name lock.

Order, so that a crash anywhere leaves a state the next reconcile finishes:

* leaving ``running``: route removed, then the driver acts, then the store
  row is compare-and-set. A crash between driver and store leaves a row
  claiming more than the machine has; reconcile repeats the (idempotent)
  driver call or records what it observes.
* destroying: row to ``deleting`` first, then route, driver, row removed.
  A ``deleting`` row is finished by whoever sees it next.
* entering ``running``: driver first, then the row, then the route, then
  (a remote node) the row's ``routed_on``, which lets attach skip the node.
  Every compare-and-set write clears ``routed_on``, and leaving ``running``
  clears it before the route goes, so it never names a route that is gone
  while the same node process runs.

A sandbox's machine is held by its node (:meth:`Nodes.of`), in the driver of
its class (``row.class_``).

* moving a stopped sandbox to another node (:meth:`Transitions.relocate`):
  the target fetches the disk from the source node to node and checks its
  SHA-256 against the sender's, then the row's ``node`` is compare-and-set,
  then the source's copy is destroyed. Until that write the row names the
  source, whose machine is untouched: any failure leaves the sandbox there
  (and the target's copy is destroyed, or its reconcile destroys it as an
  orphan). After it, a source copy left by a crash is the source's orphan.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timedelta

from podbay.dataplane.environment_seam import Building
from podbay.dataplane.metrics import Metrics
from podbay.domain import Sandbox, SandboxState
from podbay.errors import ApiError
from podbay.runtime.base import MachineState
from podbay.runtime.transfer import Received
from podbay.store.base import Store
from podbay.wire.codes import ErrorCode

from ..nodes import Node, Nodes
from .events import EventLog

log = logging.getLogger("podbay.lifecycle")
S = SandboxState


class Transitions:
    # Collaborators come in built (the composition root wires them), so a test
    # hands in fakes and no service builds another behind the caller's back.
    def __init__(
        self,
        store: Store,
        nodes: Nodes,
        metrics: Metrics,
        clock: Callable[[], datetime],
        max_age: timedelta,
    ) -> None:
        self.store = store
        self.nodes = nodes
        self.metrics = metrics
        self.clock = clock
        self.max_age = max_age
        self.events = EventLog(store, clock)

    async def _replace(self, row: Sandbox, new: Sandbox, why: str) -> Sandbox | None:
        """``new`` written over ``row`` (None when the row changed meanwhile),
        with the event the move is, in one transaction."""
        event = self.events.of_move(row.state, new.state, why)
        return await self.store.replace_sandbox(row, new, event)

    async def _moved(self, old: Sandbox, new: Sandbox | None, why: str) -> Sandbox | None:
        if new is not None:
            self.metrics.transition(old.state.value, new.state.value)
            log.info(
                "sandbox %s: %s -> %s (%s)",
                old.id,
                old.state,
                new.state,
                why,
                extra={
                    "sandbox_id": old.id,
                    "machine_id": old.machine_id,
                    "from": old.state.value,
                    "to": new.state.value,
                    "why": why,
                },
            )
        return new

    def node(self, row: Sandbox) -> Node:
        """The node that holds ``row``'s machine."""
        return self.nodes.of(row)

    async def add_route(self, sandbox: Sandbox) -> None:
        mark = await self.node(sandbox).publish(sandbox)
        if mark is not None:
            await self.store.mark_routed(sandbox, mark)

    async def _withdraw(self, node: Node, row: Sandbox) -> None:
        """The route gone: its mark first, so that a crash before the state is
        written leaves a row that attach publishes again rather than trusts.
        Whatever ``row`` says: a mark may have been written since it was read.
        An in-process node marks nothing: no store write (a suspend's answer
        waited for one more hop to the store's thread, ~20 % of it under load)."""
        if node.marks_routes:
            await self.store.clear_routed(row.id)
        await node.withdraw(row.id)

    async def suspend(self, row: Sandbox, why: str) -> Sandbox | None:
        """running → suspended (memory kept), or stopped where the driver cannot freeze."""
        node = self.node(row)
        if not node.can_suspend(row.class_):
            return await self.stop(row, why)
        await self._withdraw(node, row)
        await node.suspend(row.class_, row.machine_id)
        new = await self._replace(row, row.released(S.SUSPENDED, self.clock()), why)
        return await self._moved(row, new, why)

    async def stop(self, row: Sandbox, why: str) -> Sandbox | None:
        """→ stopped: compute released, files kept, no ceiling while nothing runs."""
        node = self.node(row)
        await self._withdraw(node, row)
        await node.stop(row.class_, row.machine_id)
        new = await self._replace(
            row, row.released(S.STOPPED, self.clock(), ceiling_at=None, started_at=None), why
        )
        return await self._moved(row, new, why)

    async def resume(self, row: Sandbox, why: str) -> Sandbox | None:
        await self.node(row).resume(row.class_, row.machine_id)
        new = await self._replace(row, row.moved(S.RUNNING, last_active_at=self.clock()), why)
        if new is not None:
            await self.add_route(new)
        return await self._moved(row, new, why)

    async def start_fresh_compute(self, row: Sandbox, why: str) -> Sandbox | None:
        """stopped → running on new compute with the files kept: a new
        incarnation (old credentials die) and a new ceiling. A sandbox whose
        node is drained or full moves first (:meth:`relocate`); when it cannot,
        it starts where it is."""
        try:
            moved = await self.relocate(row, why)
        except Exception:
            log.exception("sandbox %s: could not move; it carries over on its node", row.id)
        else:
            if moved is not None:
                row = moved[0]
        await self.node(row).start(row.class_, row.machine_id)
        new = await self._replace(row, row.started(self.clock(), self.max_age), why)
        if new is not None:
            await self.add_route(new)
        return await self._moved(row, new, why)

    async def relocate(
        self, row: Sandbox, why: str, target: Node | None = None
    ) -> tuple[Sandbox, Received] | None:
        """Move a stopped sandbox's machine to ``target`` (by default where
        :meth:`Nodes.relocation` says it should go): the row as it is then and
        what was sent, or None when it stays (nowhere to go, or the row changed
        meanwhile). Raises when a step fails; the sandbox is then where it was."""
        if row.state is not S.STOPPED:
            return None
        if target is None:
            found = await self.nodes.relocation(row)
            if found is None:
                return None
            target, reason = found
            why = f"{why}: {reason}"
        source = self.node(row)
        c, mid = row.class_, row.machine_id
        deployment = await self.store.get_deployment(row.deployment_id)
        if deployment is None:
            return None
        prepared = await target.prepare(deployment, c)
        if isinstance(prepared, Building):
            raise ApiError(
                ErrorCode.SANDBOXES_UNAVAILABLE,
                f"node {target.name} is still building the sandbox's environment",
                retry_after=prepared.retry_after_seconds,
            )
        if await target.state(c, mid) is not MachineState.ABSENT:
            # Left by a move that failed before the row named the target: nobody's.
            await target.destroy(c, mid)
        started = time.monotonic()
        try:
            transfer = replace(
                self.nodes.transfer(source, target, c, mid), env=dict(row.options.env)
            )
            received = await target.receive(transfer, prepared)
            if received.sha256 != received.sent_sha256:  # the target refuses it too
                raise ApiError(ErrorCode.INTERNAL, "the disk arrived damaged")
            new = await self._replace(row, replace(row, node=target.name), why)
        except BaseException:
            try:
                await target.destroy(c, mid)
            except Exception:
                log.exception("sandbox %s: the copy on %s stays an orphan", row.id, target.name)
            raise
        if new is None:
            await target.destroy(c, mid)
            return None
        try:
            await source.destroy(c, mid)
        except Exception:  # its reconcile destroys it: no row names it there now
            log.exception("sandbox %s: the old copy on %s stays an orphan", row.id, source.name)
        seconds = time.monotonic() - started
        await self.events.add(new, "moved", f"from node {source.name} to {target.name} ({why})")
        log.info(
            "sandbox %s: moved from %s to %s (%s): %d bytes in %.2f s, sha256 %s at both ends",
            row.id,
            source.name,
            target.name,
            why,
            received.bytes,
            seconds,
            received.sha256,
            extra={
                "sandbox_id": row.id,
                "machine_id": mid,
                "from_node": source.name,
                "to_node": target.name,
                "bytes": received.bytes,
                "seconds": round(seconds, 3),
                "sha256": received.sha256,
                "why": why,
            },
        )
        return new, received

    async def record(self, row: Sandbox, state: SandboxState, why: str) -> Sandbox | None:
        """Write what was observed, without touching the machine."""
        changes: dict[str, object] = {}
        if state is S.STOPPED:
            changes = {"ceiling_at": None, "started_at": None}
        if state is not S.RUNNING:
            await self._withdraw(self.node(row), row)
        moved = (
            row.released(state, self.clock(), **changes)
            if state in (S.SUSPENDED, S.STOPPED)
            else row.moved(state, **changes)
        )
        new = await self._replace(row, moved, why)
        if new is not None and state is S.RUNNING:
            await self.add_route(new)
        return await self._moved(row, new, why)

    async def destroy(self, row: Sandbox, why: str) -> bool:
        """Anything → gone: row marked ``deleting`` first, so a crash mid-way
        is finished by the next pass. False when somebody else changed the row."""
        if row.state is not S.DELETING:
            marked = await self._replace(row, row.moved(S.DELETING), why)
            if marked is None:
                return False
            await self._moved(row, marked, why)
            row = marked
        node = self.node(row)
        await self._withdraw(node, row)
        await node.destroy(row.class_, row.machine_id)
        return await self.store.delete_sandbox(row)
