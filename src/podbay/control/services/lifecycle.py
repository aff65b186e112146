"""The lifecycle pass and the start-up reconcile.

The store says what should be; the driver reports what is; these close the
gap. Both are idempotent and re-read each row under its name lock before
acting, so a pass that dies halfway leaves rows the next pass completes.

Thresholds (``settings.lifecycle``)::

    running,   idle >= idle_seconds (or the sandbox's
               own idle_timeout_seconds), no request
               in flight through the gateway       → suspended
    running/suspended, now >= ceiling_at            → stopped (files kept; next
                                                      attach carries them over),
                                                      and moved to another node
                                                      if its node is drained or
                                                      full (Transitions.relocate)
    suspended/stopped for >= suspended_ttl,
               counted from the suspension          → reclaimed (destroyed, row gone)
    deleting (e.g. the CLI deleted its deployment)  → destroyed, row gone
    creating with nobody holding its lock           → rolled back

A sandbox whose class this server does not run now (the operator disabled
it, or its host check failed) is left exactly as it is, row and machine,
until a server that runs its class comes along.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from podbay.dataplane.nodeapi import POOL_LABEL
from podbay.domain import Sandbox, SandboxState
from podbay.errors import ApiError
from podbay.runtime.base import MachineState, ObservedMachine
from podbay.settings import LifecycleSettings
from podbay.store.base import Store

from ..nodes import Node, Nodes
from .locks import NameLocks
from .transitions import Transitions

if TYPE_CHECKING:
    from podbay.dataplane.metrics import Metrics

log = logging.getLogger("podbay.lifecycle")
S = SandboxState
M = MachineState


class Lifecycle:
    # Collaborators come in built (the composition root wires them), so a test
    # hands in fakes and no service builds another behind the caller's back.
    def __init__(
        self,
        *,
        store: Store,
        transitions: Transitions,
        nodes: Nodes,
        locks: NameLocks,
        settings: LifecycleSettings,
        clock: Callable[[], datetime],
    ) -> None:
        self.store = store
        self.transitions = transitions
        self.nodes = nodes
        self.locks = locks
        self.settings = settings
        self.clock = clock
        #: OOM kills reported by nodes, not yet written as events: id → (when, how many).
        self._ooms: dict[str, tuple[datetime, int]] = {}
        #: Moves after a ceiling under way, by sandbox id.
        self._moves: dict[str, asyncio.Task[None]] = {}

    async def flush_activity(self) -> None:
        for node in self.nodes.all():
            try:
                self._ooms.update(await node.new_oom_kills())
            except Exception:  # an event is worth less than the activity below
                log.exception("lifecycle: no OOM kills from node %s", node.name)
            seen = await node.drain_activity()
            if not seen:
                continue
            try:
                await self.store.record_activity(seen)
            except Exception:
                node.restore_activity(seen)
                raise

    # -- the periodic pass -----------------------------------------------------------
    async def run_pass(self) -> int:
        """One pass over every sandbox; returns how many it changed."""
        await self.nodes.refresh()
        await self.flush_activity()
        changed = 0
        for row in await self.store.list_sandboxes():
            if row.id in self._ooms:
                at, count = self._ooms.pop(row.id)
                killed = "a process" if count == 1 else f"{count} processes"
                await self.transitions.events.add(
                    row,
                    "oom_killed",
                    f"the out-of-memory killer ended {killed} (seen {at:%H:%M:%S})",
                )
            if (
                self._due(row) is None
                or not self.nodes.reachable(row)
                or not self.nodes.works(row.class_)
            ):
                continue
            try:
                if await self._act(row):
                    changed += 1
            except Exception:
                log.exception("lifecycle: sandbox %s failed; next pass retries", row.id)
        self._ooms.clear()  # those left have no row any more: nobody to tell
        return changed

    def _due(self, row: Sandbox) -> str | None:
        now = self.clock()
        idle = now - row.last_active_at
        ttl = timedelta(seconds=self.settings.suspended_ttl_seconds)
        if row.state is S.DELETING:
            return "delete"
        if row.state is S.CREATING:
            return None if self.locks.busy(row.deployment_id, row.name) else "rollback"
        if row.state in (S.RUNNING, S.SUSPENDED) and row.ceiling_at and now >= row.ceiling_at:
            return "ceiling"
        if (
            row.state is S.RUNNING
            and idle >= timedelta(seconds=self._idle_seconds(row))
            and not self._busy(row)
        ):
            return "idle"
        if (
            row.state in (S.SUSPENDED, S.STOPPED)
            and now - (row.suspended_at or row.last_active_at) >= ttl
        ):
            return "reclaim"
        return None

    def _idle_seconds(self, row: Sandbox) -> float:
        """The sandbox's own idle threshold (set at attach) or the server's."""
        own = row.options.idle_timeout_seconds
        return self.settings.idle_seconds if own is None else own

    def _busy(self, row: Sandbox) -> bool:
        try:
            return self.nodes.of(row).busy(row.id)
        except ApiError:
            return True  # its node is out of reach: nothing can be done to it now

    async def _act(self, stale: Sandbox) -> bool:
        async with self.locks.hold(stale.deployment_id, stale.name):
            row = await self.store.get_sandbox(stale.deployment_id, stale.name)
            if row is None or row.id != stale.id:
                return False
            why = self._due(row)
            t = self.transitions
            if why in ("delete", "rollback", "reclaim"):
                return await t.destroy(row, why)
            if why == "ceiling":
                stopped = await t.stop(row, why)
                if stopped is not None:
                    await self._move_soon(stopped, why)
                return stopped is not None
            if why == "idle":
                return await t.suspend(row, why) is not None
            return False

    async def _move_soon(self, row: Sandbox, why: str) -> None:
        """Move a sandbox just stopped at its ceiling off a drained or full node
        now, not on its next attach (which then only starts it), in a task of
        its own: a large disk's transfer must not hold up the pass."""
        found = await self.nodes.relocation(row)
        if found is None or row.id in self._moves:
            return
        target, reason = found

        async def move() -> None:
            try:
                async with self.locks.hold(row.deployment_id, row.name):
                    current = await self.store.get_sandbox(row.deployment_id, row.name)
                    if current is not None and current.id == row.id:
                        await self.transitions.relocate(current, f"{why}: {reason}", target)
            except Exception:
                log.exception("sandbox %s: move failed; it stays on its node", row.id)
            finally:
                self._moves.pop(row.id, None)

        self._moves[row.id] = asyncio.get_running_loop().create_task(move())

    async def loop(self, on_pass: Callable[[], None] | None = None) -> None:
        try:
            while True:
                try:
                    await self.run_pass()
                    if on_pass is not None:
                        on_pass()
                except asyncio.CancelledError:
                    raise
                except Exception:
                    log.exception("lifecycle pass failed")
                await asyncio.sleep(self.settings.interval_seconds)
        finally:
            # A move cut off here cleans up after itself (Transitions.relocate):
            # the sandbox stays where it was.
            for task in list(self._moves.values()):
                task.cancel()
            await asyncio.gather(*self._moves.values(), return_exceptions=True)

    # -- a machine that stopped answering -------------------------------------------
    async def check(self, sandbox_id: str, *, silent: bool = False) -> None:
        """Ask the driver about a running sandbox whose agent did not answer, and
        record what it sees: a dead machine becomes ``stopped`` (its files kept),
        so the next attach starts it again (``carried_over``) instead of handing
        out a route to nothing. ``silent``: the gateway found the agent alive
        but not answering (stopped or traced by guest root; a hung machine), so
        a running machine is stopped all the same."""
        rows = [
            r for r in await self.store.list_sandboxes(states=[S.RUNNING]) if r.id == sandbox_id
        ]
        if not rows:
            return
        async with self.locks.hold(rows[0].deployment_id, rows[0].name):
            row = await self.store.get_sandbox(rows[0].deployment_id, rows[0].name)
            if row is None or row.id != sandbox_id or row.state is not S.RUNNING:
                return
            seen = await self.transitions.node(row).state(row.class_, row.machine_id)
            if seen is M.RUNNING and not silent:
                return
            log.warning("sandbox %s: agent unreachable, machine %s", row.id, seen)
            if seen is M.ABSENT:
                await self.transitions.destroy(row, "machine vanished")
            else:
                await self.transitions.stop(row, f"machine found {seen}")

    # -- start-up ----------------------------------------------------------------------
    async def reconcile(
        self,
        node: Node,
        observed: Mapping[str, list[ObservedMachine]],
        *,
        destroy_pooled: bool = True,
    ) -> None:
        """Make rows and machines agree after a (re)start of ``node``: ``observed``
        is what each running class's driver there adopted. Rows win where they
        state an intent; machines win where a row claims what cannot be had."""
        machines = {(name, m.machine_id): m for name, seen in observed.items() for m in seen}
        t = self.transitions
        for row in await self.store.list_sandboxes():
            if row.class_ not in observed or row.node != node.name:
                continue  # its class does not run here now: leave row and machine be
            machine = machines.pop((row.class_, row.machine_id), None)
            seen = machine.state if machine else M.ABSENT
            try:
                await self._reconcile_one(row, seen, t)
            except Exception:
                log.exception("reconcile: sandbox %s failed; the lifecycle pass retries", row.id)
        for (name, machine_id), machine in machines.items():
            # No row names it: a pooled machine from the last run, or an orphan.
            kind = "pooled" if POOL_LABEL in machine.labels else "orphaned"
            if kind == "pooled" and not destroy_pooled:
                continue  # the node's own warm pool
            log.info("reconcile: destroying %s %s machine %s", kind, name, machine_id)
            try:
                await node.destroy(name, machine_id)
            except Exception:
                log.exception("reconcile: could not destroy %s", machine_id)

    async def _reconcile_one(self, row: Sandbox, seen: MachineState, t: Transitions) -> None:
        async with self.locks.hold(row.deployment_id, row.name):
            node = t.node(row)
            c, mid = row.class_, row.machine_id
            if row.state in (S.CREATING, S.DELETING) or seen is M.ABSENT:
                await t.destroy(row, f"reconcile: row {row.state}, machine {seen}")
            elif row.state is S.RUNNING:
                if seen is M.RUNNING:
                    await t.add_route(row)
                elif seen is M.SUSPENDED:
                    await node.resume(c, mid)
                    await t.add_route(row)
                else:
                    await t.record(row, S.STOPPED, "reconcile: machine stopped")
            elif row.state is S.SUSPENDED:
                if seen is M.RUNNING:
                    await node.suspend(c, mid)
                elif seen is M.STOPPED:
                    await t.record(row, S.STOPPED, "reconcile: machine stopped")
            elif row.state is S.STOPPED and seen in (M.RUNNING, M.SUSPENDED):
                await node.stop(c, mid)


def build_lifecycle(
    store: Store,
    nodes: Nodes,
    metrics: Metrics,
    locks: NameLocks,
    settings: LifecycleSettings,
    clock: Callable[[], datetime],
) -> tuple[Transitions, Lifecycle]:
    """The transitions and the lifecycle pass over them, as every control plane
    (``serve``'s platform, a ``control`` replica) wires them."""
    transitions = Transitions(
        store, nodes, metrics, clock, timedelta(seconds=settings.max_age_seconds)
    )
    lifecycle = Lifecycle(
        store=store,
        transitions=transitions,
        nodes=nodes,
        locks=locks,
        settings=settings,
        clock=clock,
    )
    return transitions, lifecycle
