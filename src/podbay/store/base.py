"""The store interface: small on purpose, one contract for SQLite and PostgreSQL.

The store is the one home of sandbox state. Every sandbox write is a
compare-and-set on the record's ``version``: :meth:`Store.replace_sandbox`
returns ``None`` when somebody else wrote first, and the caller re-reads.
Activity (``last_active_at``) is the exception: it only ever moves forward,
so :meth:`Store.record_activity` merges without a version check.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from enum import StrEnum
from typing import Protocol

from podbay.domain import Deployment, Sandbox, SandboxState
from podbay.wire.observe import SandboxEvent


class InsertOutcome(StrEnum):
    INSERTED = "inserted"
    EXISTS = "exists"  # (deployment, name) already has a row
    DEPLOYMENT_CAP = "deployment_cap"
    ACCOUNT_CAP = "account_cap"


class Store(Protocol):
    # -- deployments ---------------------------------------------------------
    async def add_deployment(self, deployment: Deployment) -> bool:
        """False when the name is taken."""

    async def update_deployment(self, deployment: Deployment) -> bool:
        """Replace spec fields of an existing deployment (by id); False if gone."""

    async def get_deployment(self, deployment_id: str) -> Deployment | None: ...

    async def find_deployment(self, name: str) -> Deployment | None: ...

    async def list_deployments(self) -> list[Deployment]: ...

    async def remove_deployment(self, deployment_id: str) -> bool:
        """Drop the deployment and mark its sandboxes ``deleting`` in one
        transaction; the server's next lifecycle pass destroys their machines."""

    # -- sandboxes -----------------------------------------------------------
    async def get_sandbox(self, deployment_id: str, name: str) -> Sandbox | None: ...

    async def list_sandboxes(
        self,
        *,
        deployment_id: str | None = None,
        states: Sequence[SandboxState] | None = None,
    ) -> list[Sandbox]: ...

    async def insert_sandbox(
        self,
        sandbox: Sandbox,
        *,
        deployment_cap: int,
        account_cap: int,
        event: SandboxEvent | None = None,
    ) -> InsertOutcome:
        """Insert unless the name exists or a cap is reached, atomically: two
        racing inserts never both pass a cap, and never both create one name.
        ``deleting`` rows do not count toward caps. ``event``, if given, is
        written in the same transaction when the row is."""

    async def replace_sandbox(
        self, old: Sandbox, new: Sandbox, event: SandboxEvent | None = None
    ) -> Sandbox | None:
        """Write ``new`` if the row still has ``old.version``; returns the stored
        record (version bumped, ``routed_on`` cleared) or ``None`` when the row
        changed or vanished. ``event``, if given, is written in the same
        transaction when the row is: a transition and its event commit together."""

    async def mark_routed(self, sandbox: Sandbox, boot: str) -> bool:
        """Record that node process ``boot`` took the route of ``sandbox`` if the
        row is still that running version (no version bump: not a transition)."""

    async def clear_routed(self, sandbox_id: str) -> None:
        """Forget where the route is published (before it is withdrawn)."""

    async def delete_sandbox(self, sandbox: Sandbox) -> bool:
        """Remove the row if it still has ``sandbox.version``."""

    async def record_activity(self, seen: Mapping[str, datetime]) -> None:
        """``sandbox id → last seen``; only ever moves ``last_active_at`` forward."""

    # -- settings the CLI and the server share -----------------------------------
    # -- lifecycle events (:mod:`.observe`) ----------------------------------
    async def add_event(
        self, deployment_id: str, name: str, sandbox_id: str, event: SandboxEvent
    ) -> None: ...

    async def list_events(
        self, deployment_id: str, name: str, since: datetime | None = None
    ) -> list[SandboxEvent]: ...

    async def get_meta(self, key: str) -> str | None: ...

    async def set_meta(self, key: str, value: str) -> None: ...

    async def close(self) -> None: ...
