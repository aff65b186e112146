"""Each sandbox's lifecycle events, written to the store as its transitions
happen (docs/observability.md): what a person debugging a run reads first.

A transition's event is written in the transition's own store transaction
(:meth:`~podbay.store.base.Store.replace_sandbox`): it exists exactly when the
transition committed, and costs no second commit. Events that record no state
change (a policy change, an OOM kill, a move) are written on their own: failing
to write one of those is logged and fails nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime

from podbay.domain import Sandbox, SandboxState
from podbay.store.base import Store
from podbay.wire.observe import EventKind, SandboxEvent, on_the_wire

log = logging.getLogger("podbay.lifecycle")
S = SandboxState
#: Longest reason kept (a reason may quote a driver's error).
MAX_REASON = 500

_ENTERED: dict[tuple[SandboxState, SandboxState], EventKind] = {
    (S.CREATING, S.RUNNING): "ready",
    (S.RUNNING, S.SUSPENDED): "suspended",
    (S.SUSPENDED, S.RUNNING): "resumed",
    (S.STOPPED, S.RUNNING): "carried_over",
}


def kind_of(old: SandboxState, new: SandboxState) -> EventKind | None:
    """The event a move from ``old`` to ``new`` is, or None (nothing to say)."""
    if new is S.DELETING:
        return "removed"
    if new is S.STOPPED and old is not S.STOPPED:
        return "stopped"
    return _ENTERED.get((old, new))


class EventLog:
    def __init__(self, store: Store, clock: Callable[[], datetime]) -> None:
        self.store = store
        self.clock = clock

    def event(self, kind: EventKind, reason: str = "") -> SandboxEvent:
        return SandboxEvent(at=on_the_wire(self.clock()), kind=kind, reason=reason[:MAX_REASON])

    def of_move(self, old: SandboxState, new: SandboxState, why: str) -> SandboxEvent | None:
        """The event a move from ``old`` to ``new`` writes with it, or None."""
        kind = kind_of(old, new)
        return None if kind is None else self.event(kind, why)

    async def add(self, row: Sandbox, kind: EventKind, reason: str = "") -> None:
        event = self.event(kind, reason)
        try:
            await self.store.add_event(row.deployment_id, row.name, row.id, event)
        except Exception:
            log.exception("sandbox %s: its %s event was not recorded", row.id, kind)
