"""The store's queries for per-sandbox lifecycle events (docs/observability.md).

A mixin of :class:`~podbay.store.sql.SqlStore`, like
:class:`~podbay.store.e2b.E2BQueries`: the same SQL for SQLite and PostgreSQL.
"""

# ruff: noqa: S608 - the only interpolated value is a module constant.

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

from podbay.wire.observe import SandboxEvent

from .rows import at, ts

T = TypeVar("T")
#: Events kept per sandbox name: the newest.
MAX_EVENTS = 200


class EventQueries:
    if TYPE_CHECKING:  # provided by SqlStore, whose mixin this is

        async def _run(self, fn: Callable[[Any], T]) -> T: ...

        async def _tx(self, fn: Callable[[Any], T]) -> T: ...

        def _sql(self, text: str) -> str: ...

        def _count(self, conn: Any, text: str, *params: Any) -> int: ...

    async def add_event(
        self, deployment_id: str, name: str, sandbox_id: str, event: SandboxEvent
    ) -> None:
        await self._tx(lambda conn: self._write_event(conn, deployment_id, name, sandbox_id, event))

    def _write_event(
        self, conn: Any, deployment_id: str, name: str, sandbox_id: str, event: SandboxEvent
    ) -> None:
        """Inside a write transaction: the event, and the oldest beyond the
        newest MAX_EVENTS of that name gone. A transition writes its event in
        its own transaction (:meth:`SqlStore.replace_sandbox`), so the event
        exists exactly when the transition committed."""
        insert = (
            "INSERT INTO sandbox_events (deployment_id, name, sandbox_id, at, kind, reason)"
            " VALUES (?,?,?,?,?,?)"
        )
        # None go while fewer than MAX_EVENTS: the subquery is NULL, which compares false.
        trim = (
            "DELETE FROM sandbox_events WHERE deployment_id=? AND name=? AND at < ("
            "SELECT at FROM sandbox_events WHERE deployment_id=? AND name=?"
            f" ORDER BY at DESC LIMIT 1 OFFSET {MAX_EVENTS - 1})"
        )
        values = (deployment_id, name, sandbox_id, ts(event.at), event.kind, event.reason)
        self._count(conn, insert, *values)
        self._count(conn, trim, deployment_id, name, deployment_id, name)

    async def list_events(
        self, deployment_id: str, name: str, since: datetime | None = None
    ) -> list[SandboxEvent]:
        sql = "SELECT at, kind, reason FROM sandbox_events WHERE deployment_id=? AND name=?"
        params: list[object] = [deployment_id, name]
        if since is not None:
            sql += " AND at > ?"
            params.append(ts(since))
        sql += " ORDER BY at"
        rows = await self._run(lambda conn: conn.execute(self._sql(sql), params).fetchall())
        return [SandboxEvent(at=at(r[0]), kind=r[1], reason=r[2]) for r in rows]
