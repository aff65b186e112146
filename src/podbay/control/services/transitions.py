"""Moving one sandbox between states: driver, gateway route and store in a
fixed order. Callers hold the sandbox's name lock.

Order, so that a crash anywhere leaves a state the next reconcile finishes:

* leaving ``running``: route removed, then the driver acts, then the store
  row is compare-and-set. A crash between driver and store leaves a row
  claiming more than the machine has; reconcile repeats the (idempotent)
  driver call or records what it observes.
* destroying: row to ``deleting`` first, then route, driver, row removed.
  A ``deleting`` row is finished by whoever sees it next.
* entering ``running``: driver first, then the row, then the route.

A sandbox's machine belongs to the driver of its class (``row.class_``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime, timedelta

from podbay.domain import Sandbox, SandboxState
from podbay.gateway.routes import RouteTable
from podbay.runtime.base import Driver
from podbay.store.base import Store

from ..metrics import Metrics
from .classes import ClassRuntimes

log = logging.getLogger("podbay.lifecycle")
S = SandboxState


class Transitions:
    def __init__(
        self,
        store: Store,
        classes: ClassRuntimes,
        routes: RouteTable,
        metrics: Metrics,
        clock: Callable[[], datetime],
        max_age: timedelta,
    ) -> None:
        self.store = store
        self.classes = classes
        self.routes = routes
        self.metrics = metrics
        self.clock = clock
        self.max_age = max_age

    def _moved(self, old: Sandbox, new: Sandbox | None, why: str) -> Sandbox | None:
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

    def driver(self, row: Sandbox) -> Driver:
        """The driver that holds ``row``'s machine (its class must be running)."""
        return self.classes.driver(self.classes.require(row.class_))

    def add_route(self, sandbox: Sandbox) -> None:
        self.routes.add(
            sandbox.id,
            sandbox.machine_id,
            sandbox.incarnation,
            self.driver(sandbox).agent_socket(sandbox.machine_id),
        )

    async def suspend(self, row: Sandbox, why: str) -> Sandbox | None:
        """running → suspended (memory kept), or stopped where the driver cannot freeze."""
        driver = self.driver(row)
        if not driver.capabilities.suspend:
            return await self.stop(row, why)
        self.routes.remove(row.id)
        await driver.suspend(row.machine_id)
        new = await self.store.replace_sandbox(row, row.released(S.SUSPENDED, self.clock()))
        return self._moved(row, new, why)

    async def stop(self, row: Sandbox, why: str) -> Sandbox | None:
        """→ stopped: compute released, files kept, no ceiling while nothing runs."""
        self.routes.remove(row.id)
        await self.driver(row).stop(row.machine_id)
        new = await self.store.replace_sandbox(
            row, row.released(S.STOPPED, self.clock(), ceiling_at=None, started_at=None)
        )
        return self._moved(row, new, why)

    async def resume(self, row: Sandbox, why: str) -> Sandbox | None:
        await self.driver(row).resume(row.machine_id)
        new = await self.store.replace_sandbox(
            row, row.moved(S.RUNNING, last_active_at=self.clock())
        )
        if new is not None:
            self.add_route(new)
        return self._moved(row, new, why)

    async def start_fresh_compute(self, row: Sandbox, why: str) -> Sandbox | None:
        """stopped → running on new compute with the files kept: a new
        incarnation (old credentials die) and a new ceiling."""
        await self.driver(row).start(row.machine_id)
        new = await self.store.replace_sandbox(row, row.started(self.clock(), self.max_age))
        if new is not None:
            self.add_route(new)
        return self._moved(row, new, why)

    async def record(self, row: Sandbox, state: SandboxState, why: str) -> Sandbox | None:
        """Write what was observed, without touching the machine."""
        changes: dict[str, object] = {}
        if state is S.STOPPED:
            changes = {"ceiling_at": None, "started_at": None}
        if state is not S.RUNNING:
            self.routes.remove(row.id)
        moved = (
            row.released(state, self.clock(), **changes)
            if state in (S.SUSPENDED, S.STOPPED)
            else row.moved(state, **changes)
        )
        new = await self.store.replace_sandbox(row, moved)
        if new is not None and state is S.RUNNING:
            self.add_route(new)
        return self._moved(row, new, why)

    async def destroy(self, row: Sandbox, why: str) -> bool:
        """Anything → gone: row marked ``deleting`` first, so a crash mid-way
        is finished by the next pass. False when somebody else changed the row."""
        if row.state is not S.DELETING:
            marked = await self.store.replace_sandbox(row, row.moved(S.DELETING))
            if marked is None:
                return False
            self._moved(row, marked, why)
            row = marked
        self.routes.remove(row.id)
        await self.driver(row).destroy(row.machine_id)
        return await self.store.delete_sandbox(row)
