"""A sandbox record and the state machine its transitions follow.

::

    (absent) ─insert─► creating ─started─► running ◄──resume── suspended
                          │                  │  └──suspend/idle──►  │
                          │                  └──stop/ceiling──► stopped
                          │                           ▲  └─carry over─► running
                          ▼                           │
                       deleting ◄──────── reclaim / delete (from any)
                          │
                       (row removed)

``creating`` and ``deleting`` are in-flight states: a pass that dies while a
row holds one leaves it for the next reconcile, which finishes the job
(``creating`` rolls back, ``deleting`` completes). Every write is a
compare-and-set on ``version``, so two writers never both win.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Literal

from .options import NO_OPTIONS, SandboxOptions

StartKind = Literal["created", "resumed", "reused", "carried_over"]


class SandboxState(StrEnum):
    CREATING = "creating"
    RUNNING = "running"
    SUSPENDED = "suspended"
    STOPPED = "stopped"
    DELETING = "deleting"  # never shown: a deleting sandbox is already gone to callers

    @property
    def visible(self) -> bool:
        return self is not SandboxState.DELETING


S = SandboxState
TRANSITIONS: dict[SandboxState, frozenset[SandboxState]] = {
    S.CREATING: frozenset({S.RUNNING, S.DELETING}),
    S.RUNNING: frozenset({S.SUSPENDED, S.STOPPED, S.DELETING}),
    S.SUSPENDED: frozenset({S.RUNNING, S.STOPPED, S.DELETING}),
    S.STOPPED: frozenset({S.RUNNING, S.DELETING}),
    S.DELETING: frozenset(),
}


def can_transition(old: SandboxState, new: SandboxState) -> bool:
    return new in TRANSITIONS[old]


def new_sandbox_id() -> str:
    return "sb-" + secrets.token_hex(8)


# The id makers and the record below are alike in shape to deployment.py's on
# purpose: each record of the domain declares its own fields and id format.
def new_machine_id() -> str:
    """Machine ids are path and cgroup components: lowercase hex only."""
    return "m-" + secrets.token_hex(8)


@dataclass(frozen=True, kw_only=True)
class Sandbox:
    id: str
    deployment_id: str
    account: str
    name: str
    class_: str
    state: SandboxState
    machine_id: str
    created_at: datetime
    last_active_at: datetime
    #: When the running incarnation started; the ceiling counts from here.
    started_at: datetime | None
    #: Ceiling of the running (or suspended) incarnation; ``None`` while nothing runs.
    ceiling_at: datetime | None
    #: Bumped each time compute starts from nothing (create, carry over): a
    #: credential names one incarnation and dies with it.
    incarnation: int = 0
    #: Compare-and-set token; the store bumps it on every write.
    version: int = 0
    #: When compute was last released (suspended or stopped); ``None`` while
    #: running. A suspended or stopped sandbox is reclaimed counting from here.
    suspended_at: datetime | None = None
    #: The node that holds the machine (``local``: the all-in-one server's).
    node: str = "local"
    #: The boot id of the node process that took this incarnation's route
    #: (a cluster's control plane records it after publishing, so an attach
    #: that finds it equal to the node's current boot needs no call to the
    #: node); ``None``: not known to be published. Every compare-and-set
    #: write clears it.
    routed_on: str | None = None
    #: The class word the attach that created it gave (``default`` when none):
    #: what callers see as ``class``, while ``class_`` is the class it runs.
    asked_class: str = "default"
    #: What attach set at creation (labels, variables, CPU, memory, idle timeout).
    options: SandboxOptions = NO_OPTIONS

    def moved(self, state: SandboxState, **changes: object) -> Sandbox:
        """This record in ``state``; raises ``ValueError`` on an illegal move."""
        if not can_transition(self.state, state):
            raise ValueError(f"sandbox {self.id}: {self.state} → {state} is not a transition")
        if state is SandboxState.RUNNING:
            changes.setdefault("suspended_at", None)
        return replace(self, state=state, **changes)  # type: ignore[arg-type]

    def released(self, state: SandboxState, now: datetime, **changes: object) -> Sandbox:
        """Moved to ``suspended`` or ``stopped``; the reclaim clock starts now,
        unless it already runs (suspended, then stopped at its ceiling)."""
        return self.moved(state, suspended_at=self.suspended_at or now, **changes)

    def started(self, now: datetime, max_age: timedelta) -> Sandbox:
        """Running on fresh compute: a new incarnation with a new ceiling."""
        return self.moved(
            SandboxState.RUNNING,
            started_at=now,
            ceiling_at=now + max_age,
            last_active_at=now,
            incarnation=self.incarnation + 1,
        )
