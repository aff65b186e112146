"""A sandbox host enrolled with the control plane (``podbay node``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any


# Alike in shape to runtime.base's MachineSpec (a frozen record of typed fields
# with their comments) by coincidence only: nothing is shared between them.
@dataclass(frozen=True, kw_only=True)
class NodeRecord:
    name: str
    #: Where clients and the control plane reach it (its ``advertise_url``).
    url: str
    #: An operator drained it: no new sandboxes go there.
    drained: bool
    #: Its last heartbeat: ``classes`` (list), ``capacity`` (int, sandboxes it
    #: holds at most), ``running`` (int), ``warm`` (class → ready machines),
    #: ``busy`` (sandbox ids with a request in flight), ``boot`` (changes on restart).
    report: dict[str, Any] = field(default_factory=dict)
    enrolled_at: datetime
    heartbeat_at: datetime
    #: SHA-256 of the node credential its enrollment gave it: control calls
    #: name it, so only that enrollment's node takes them.
    credential_hash: str = field(default="", repr=False)

    def lost(self, now: datetime, after_seconds: float) -> bool:
        """No heartbeat for ``after_seconds``: it may be dead or cut off."""
        return (now - self.heartbeat_at).total_seconds() >= after_seconds

    def state(self, now: datetime, lost_after: float) -> str:
        if self.lost(now, lost_after):
            return "lost"
        return "draining" if self.drained else "ready"
