"""The store's queries, written once for every SQL database it runs on.

:class:`SqlStore` holds every query of :class:`~podbay.store.base.Store`;
a subclass says how its database differs, through a few hooks:

- how a call reaches a connection (:meth:`SqlStore._run`, :meth:`SqlStore._tx`);
- the parameter marker (queries here are written with ``?``; PostgreSQL's
  driver wants ``%s``, see :attr:`SqlStore.PARAM`);
- the two-argument maximum (``max`` / ``GREATEST``) and byte-order sorting;
- how a sandbox insert serialises with racing inserts
  (:meth:`SqlStore._lock_for_insert`), and how one statement runs for many rows.

Everything else (upserts with ``ON CONFLICT``, ``RETURNING``, ``<>``) is SQL
both SQLite (3.35 or later) and PostgreSQL run as written.
"""

# ruff: noqa: S608 - column lists are module constants; every value is a parameter.

from __future__ import annotations

import json
import sqlite3
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from importlib import resources
from typing import Any, ClassVar, Generic, Protocol, TypeVar

from podbay.domain import Deployment, Sandbox, SandboxState
from podbay.wire.observe import SandboxEvent

from .base import InsertOutcome
from .cluster_queries import ClusterQueries
from .e2b import E2BQueries
from .observe import EventQueries
from .rows import DEPLOYMENT_COLUMNS, SANDBOX_COLUMNS, Row, deployment, sandbox, sandbox_values, ts

T = TypeVar("T")

#: One activity row: (last seen as unix seconds, sandbox id).
ActivityRow = tuple[float | None, str]


class Cursor(Protocol):
    """What the queries read back: ``sqlite3.Cursor`` and psycopg's both fit."""

    @property
    def rowcount(self) -> int: ...

    def fetchone(self) -> Row | None: ...

    def fetchall(self) -> Sequence[Row]: ...


class Connection(Protocol):
    """What the queries need of a connection: ``sqlite3`` and psycopg both fit."""

    def execute(self, sql: str, params: Sequence[object], /) -> Cursor: ...


C = TypeVar("C", bound=Connection)


def migrations() -> list[tuple[int, str]]:
    """(version, sql) for every file in ``migrations/``, in order."""
    out = []
    for entry in resources.files("podbay.store.migrations").iterdir():
        if entry.name.endswith(".sql"):
            out.append((int(entry.name.split("_", 1)[0]), entry.read_text()))
    return sorted(out)


def statements(sql: str) -> list[str]:
    """Split a script into statements (``;`` inside comments is not an end)."""
    out, current = [], ""
    for line in sql.splitlines(keepends=True):
        current += line
        if sqlite3.complete_statement(current):
            out.append(current.strip())
            current = ""
    if current.strip() and not all(
        ln.strip().startswith("--") or not ln.strip() for ln in current.splitlines()
    ):
        raise ValueError(f"incomplete statement in migration: {current!r}")
    return out


def _section(d: Deployment) -> str | None:
    return None if d.sandbox_section is None else json.dumps(d.sandbox_section)


class SqlStore(ClusterQueries, E2BQueries, EventQueries, ABC, Generic[C]):
    """:class:`~podbay.store.base.Store`'s queries over a :class:`Connection`."""

    #: The driver's parameter marker; queries are written with ``?``.
    PARAM: ClassVar[str] = "?"
    #: The scalar maximum of two values.
    GREATEST: ClassVar[str] = "max"
    #: Appended to a text column in ORDER BY to sort by bytes, whatever the locale.
    BYTE_ORDER: ClassVar[str] = ""

    # -- hooks -----------------------------------------------------------------
    @abstractmethod
    async def _run(self, fn: Callable[[C], T]) -> T:
        """Run ``fn`` (one statement) off the event loop."""

    @abstractmethod
    async def _tx(self, fn: Callable[[C], T]) -> T:
        """Run ``fn`` in one write transaction, committed unless it raises."""

    @abstractmethod
    def _lock_for_insert(self, conn: C, s: Sandbox) -> None:
        """Inside :meth:`_tx`: make racing inserts into ``s``'s deployment or
        account wait for this one to commit before they count."""

    @abstractmethod
    def _executemany(self, conn: C, sql: str, rows: Sequence[ActivityRow]) -> None:
        """Run one statement (already in the driver's markers) once per row."""

    def _sql(self, text: str) -> str:
        return text if self.PARAM == "?" else text.replace("?", self.PARAM)

    def _one(self, conn: C, text: str, *params: object) -> Any:
        """The first row or None. Read to the end: SQLite ends a statement
        (``RETURNING`` included) only when its rows are all read."""
        rows = conn.execute(self._sql(text), params).fetchall()
        return rows[0] if rows else None

    def _count(self, conn: C, text: str, *params: object) -> int:
        return conn.execute(self._sql(text), params).rowcount

    # -- deployments ---------------------------------------------------------
    async def add_deployment(self, deployment: Deployment) -> bool:
        d = deployment
        values = (d.id, d.name, d.account, d.spec_text, _section(d))
        sql = (
            f"INSERT INTO deployments ({DEPLOYMENT_COLUMNS})"
            " VALUES (?,?,?,?,?,?,?) ON CONFLICT DO NOTHING"
        )
        return await self._run(
            lambda conn: self._count(conn, sql, *values, ts(d.created_at), ts(d.updated_at)) == 1
        )

    async def update_deployment(self, deployment: Deployment) -> bool:
        d = deployment
        sql = (
            "UPDATE deployments SET spec_text=?, sandbox_section=?, account=?, updated_at=?"
            " WHERE id=?"
        )
        values = (d.spec_text, _section(d), d.account, ts(d.updated_at), d.id)
        return await self._run(lambda conn: self._count(conn, sql, *values) == 1)

    async def get_deployment(self, deployment_id: str) -> Deployment | None:
        sql = f"SELECT {DEPLOYMENT_COLUMNS} FROM deployments WHERE id=?"
        row = await self._run(lambda conn: self._one(conn, sql, deployment_id))
        return None if row is None else deployment(row)

    async def find_deployment(self, name: str) -> Deployment | None:
        sql = f"SELECT {DEPLOYMENT_COLUMNS} FROM deployments WHERE name=?"
        row = await self._run(lambda conn: self._one(conn, sql, name))
        return None if row is None else deployment(row)

    async def list_deployments(self) -> list[Deployment]:
        sql = f"SELECT {DEPLOYMENT_COLUMNS} FROM deployments ORDER BY name{self.BYTE_ORDER}"
        rows = await self._run(lambda conn: conn.execute(sql, ()).fetchall())
        return [deployment(r) for r in rows]

    async def remove_deployment(self, deployment_id: str) -> bool:
        def run(conn: C) -> bool:
            gone = self._count(conn, "DELETE FROM deployments WHERE id=?", deployment_id) == 1
            self._count(conn, "DELETE FROM sandbox_events WHERE deployment_id=?", deployment_id)
            self._count(
                conn,
                "UPDATE sandboxes SET state='deleting', version=version+1"
                " WHERE deployment_id=? AND state<>'deleting'",
                deployment_id,
            )
            return gone

        return await self._tx(run)

    # -- sandboxes -----------------------------------------------------------
    async def get_sandbox(self, deployment_id: str, name: str) -> Sandbox | None:
        sql = f"SELECT {SANDBOX_COLUMNS} FROM sandboxes WHERE deployment_id=? AND name=?"
        row = await self._run(lambda conn: self._one(conn, sql, deployment_id, name))
        return None if row is None else sandbox(row)

    async def list_sandboxes(
        self,
        *,
        deployment_id: str | None = None,
        states: Sequence[SandboxState] | None = None,
    ) -> list[Sandbox]:
        where: list[str] = []
        args: list[str] = []
        if deployment_id is not None:
            where.append("deployment_id=?")
            args.append(deployment_id)
        if states is not None:
            if not states:
                return []
            where.append(f"state IN ({','.join('?' * len(states))})")
            args.extend(s.value for s in states)
        sql = f"SELECT {SANDBOX_COLUMNS} FROM sandboxes"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql = self._sql(sql + f" ORDER BY created_at, name{self.BYTE_ORDER}")
        rows = await self._run(lambda conn: conn.execute(sql, args).fetchall())
        return [sandbox(r) for r in rows]

    async def insert_sandbox(
        self,
        sandbox: Sandbox,
        *,
        deployment_cap: int,
        account_cap: int,
        event: SandboxEvent | None = None,
    ) -> InsertOutcome:
        s = sandbox
        live = "state<>'deleting'"

        def run(conn: C) -> InsertOutcome:
            self._lock_for_insert(conn, s)
            if self._one(
                conn,
                "SELECT 1 FROM sandboxes WHERE deployment_id=? AND name=?",
                s.deployment_id,
                s.name,
            ):
                return InsertOutcome.EXISTS
            sql = f"SELECT count(*) FROM sandboxes WHERE deployment_id=? AND {live}"
            if self._one(conn, sql, s.deployment_id)[0] >= deployment_cap:
                return InsertOutcome.DEPLOYMENT_CAP
            sql = f"SELECT count(*) FROM sandboxes WHERE account=? AND {live}"
            if self._one(conn, sql, s.account)[0] >= account_cap:
                return InsertOutcome.ACCOUNT_CAP
            # The unique key has the last word: a same-name row that got in
            # past the lock ends this insert as EXISTS, not as an error.
            inserted = self._count(
                conn,
                f"INSERT INTO sandboxes ({SANDBOX_COLUMNS})"
                " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,0,?,?,NULL,?,?)"
                " ON CONFLICT (deployment_id, name) DO NOTHING",
                *sandbox_values(s),
            )
            if inserted != 1:
                return InsertOutcome.EXISTS
            if event is not None:
                self._write_event(conn, s.deployment_id, s.name, s.id, event)
            return InsertOutcome.INSERTED

        return await self._tx(run)

    async def replace_sandbox(
        self, old: Sandbox, new: Sandbox, event: SandboxEvent | None = None
    ) -> Sandbox | None:
        if new.id != old.id:
            raise ValueError("replace_sandbox: ids differ")
        sql = (
            "UPDATE sandboxes SET deployment_id=?, account=?, name=?, class=?, state=?,"
            f" machine_id=?, created_at=?, last_active_at={self.GREATEST}(last_active_at, ?),"
            " started_at=?, ceiling_at=?, incarnation=?, suspended_at=?, node=?, routed_on=NULL,"
            " asked_class=?, options=?,"
            f" version=version+1 WHERE id=? AND version=? RETURNING {SANDBOX_COLUMNS}"
        )
        params = (*sandbox_values(new)[1:], old.id, old.version)

        def run(conn: C) -> Any:
            row = self._one(conn, sql, *params)
            if row is not None and event is not None:
                self._write_event(conn, new.deployment_id, new.name, new.id, event)
            return row

        row = await self._tx(run)
        return None if row is None else sandbox(row)

    async def mark_routed(self, sandbox: Sandbox, boot: str) -> bool:
        sql = "UPDATE sandboxes SET routed_on=? WHERE id=? AND version=? AND state='running'"
        return await self._run(
            lambda conn: self._count(conn, sql, boot, sandbox.id, sandbox.version) == 1
        )

    async def clear_routed(self, sandbox_id: str) -> None:
        sql = "UPDATE sandboxes SET routed_on=NULL WHERE id=? AND routed_on IS NOT NULL"
        await self._run(lambda conn: self._count(conn, sql, sandbox_id))

    async def delete_sandbox(self, sandbox: Sandbox) -> bool:
        sql = "DELETE FROM sandboxes WHERE id=? AND version=?"
        return await self._run(
            lambda conn: self._count(conn, sql, sandbox.id, sandbox.version) == 1
        )

    async def record_activity(self, seen: Mapping[str, datetime]) -> None:
        if not seen:
            return
        # In id order: two servers recording overlapping sets lock rows in one
        # order, so they wait for each other instead of deadlocking. Not a
        # version bump: activity never conflicts with a transition.
        rows = [(ts(seen[sandbox_id]), sandbox_id) for sandbox_id in sorted(seen)]
        sql = self._sql(
            f"UPDATE sandboxes SET last_active_at={self.GREATEST}(last_active_at, ?) WHERE id=?"
        )
        await self._tx(lambda conn: self._executemany(conn, sql, rows))

    # -- meta --------------------------------------------------------------------
    async def get_meta(self, key: str) -> str | None:
        sql = "SELECT value FROM meta WHERE key=?"
        row = await self._run(lambda conn: self._one(conn, sql, key))
        return None if row is None else str(row[0])

    async def set_meta(self, key: str, value: str) -> None:
        sql = (
            "INSERT INTO meta (key, value) VALUES (?, ?)"
            " ON CONFLICT (key) DO UPDATE SET value=excluded.value"
        )
        await self._run(lambda conn: self._count(conn, sql, key, value))
