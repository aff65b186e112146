"""The store's queries for E2B compatibility (:mod:`podbay.e2b`): API keys
(hashed) and E2B's per-sandbox fields.

A mixin of :class:`~podbay.store.sql.SqlStore`, like
:class:`~podbay.store.cluster_queries.ClusterQueries`: the same SQL for SQLite and
PostgreSQL.
"""

# ruff: noqa: S608 - column lists are module constants; every value is a parameter.

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from podbay.domain import Deployment

from .rows import DEPLOYMENT_COLUMNS, at, deployment, ts

T = TypeVar("T")
E2B_COLUMNS = (
    "sandbox_id, deployment_id, template, metadata, env_vars, started_at, end_at,"
    " on_timeout, paused_at"
)
#: An E2B row and its deployment's, in one statement (the sandbox API's check
#: of every call: one trip to the store, not two).
_WITH_DEPLOYMENT = (
    "SELECT "
    + ", ".join("e." + c.strip() for c in E2B_COLUMNS.split(","))
    + ", "
    + ", ".join("d." + c.strip() for c in DEPLOYMENT_COLUMNS.split(","))
    + " FROM e2b_sandboxes e JOIN deployments d ON d.id = e.deployment_id WHERE e.sandbox_id=?"
)


@dataclass(frozen=True, kw_only=True)
class E2BSandbox:
    """E2B's fields of one sandbox; ``sandbox_id`` is also its podbay name."""

    sandbox_id: str
    deployment_id: str
    template: str
    metadata: dict[str, str]
    env_vars: dict[str, str]
    started_at: datetime
    end_at: datetime
    #: E2B's ``onTimeout``: ``kill`` or ``pause`` at ``end_at``.
    on_timeout: str = "kill"
    #: Set while paused (by the timeout or E2B's pause): no timeout applies then.
    paused_at: datetime | None = None


def _row(row: Sequence[Any]) -> E2BSandbox:
    return E2BSandbox(
        sandbox_id=row[0],
        deployment_id=row[1],
        template=row[2],
        metadata=json.loads(row[3]),
        env_vars=json.loads(row[4]),
        started_at=at(row[5]),
        end_at=at(row[6]),
        on_timeout=row[7],
        paused_at=None if row[8] is None else at(row[8]),
    )


class E2BStore(Protocol):
    """What :mod:`podbay.e2b` needs of the store (every SqlStore has it)."""

    async def add_e2b_key(self, key_hash: str, deployment_id: str, now: datetime) -> None: ...

    async def e2b_key_deployment(self, key_hash: str) -> str | None: ...

    async def revoke_e2b_keys(self, deployment_id: str, now: datetime) -> int: ...

    async def add_e2b_sandbox(self, sandbox: E2BSandbox) -> None: ...

    async def get_e2b_sandbox(self, sandbox_id: str) -> E2BSandbox | None: ...

    async def get_e2b_sandbox_and_deployment(
        self, sandbox_id: str
    ) -> tuple[E2BSandbox, Deployment] | None: ...

    async def list_e2b_sandboxes(
        self, *, deployment_id: str | None = None, ended_by: datetime | None = None
    ) -> list[E2BSandbox]: ...

    async def set_e2b_end(self, sandbox_id: str, end_at: datetime) -> bool: ...

    async def set_e2b_paused(
        self, sandbox_id: str, paused_at: datetime | None, end_at: datetime | None = None
    ) -> bool: ...

    async def delete_e2b_sandbox(self, sandbox_id: str) -> None: ...


class E2BQueries:
    if TYPE_CHECKING:  # provided by SqlStore, whose mixin this is

        async def _run(self, fn: Callable[[Any], T]) -> T: ...

        async def _tx(self, fn: Callable[[Any], T]) -> T: ...

        def _one(self, conn: Any, text: str, *params: Any) -> Any: ...

        def _sql(self, text: str) -> str: ...

        def _count(self, conn: Any, text: str, *params: Any) -> int: ...

    # -- keys ----------------------------------------------------------------------
    async def add_e2b_key(self, key_hash: str, deployment_id: str, now: datetime) -> None:
        sql = "INSERT INTO e2b_keys (key_hash, deployment_id, created_at) VALUES (?,?,?)"
        await self._run(lambda conn: self._count(conn, sql, key_hash, deployment_id, ts(now)))

    async def e2b_key_deployment(self, key_hash: str) -> str | None:
        """The deployment id of a key that is not revoked."""
        sql = "SELECT deployment_id FROM e2b_keys WHERE key_hash=? AND revoked_at IS NULL"
        row = await self._run(lambda conn: self._one(conn, sql, key_hash))
        return None if row is None else str(row[0])

    async def revoke_e2b_keys(self, deployment_id: str, now: datetime) -> int:
        """Revoke every live key of the deployment; how many there were."""
        sql = "UPDATE e2b_keys SET revoked_at=? WHERE deployment_id=? AND revoked_at IS NULL"
        return await self._run(lambda conn: self._count(conn, sql, ts(now), deployment_id))

    # -- sandboxes -----------------------------------------------------------------
    async def add_e2b_sandbox(self, sandbox: E2BSandbox) -> None:
        sql = f"INSERT INTO e2b_sandboxes ({E2B_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?)"
        values = (
            sandbox.sandbox_id,
            sandbox.deployment_id,
            sandbox.template,
            json.dumps(sandbox.metadata),
            json.dumps(sandbox.env_vars),
            ts(sandbox.started_at),
            ts(sandbox.end_at),
            sandbox.on_timeout,
            None if sandbox.paused_at is None else ts(sandbox.paused_at),
        )
        await self._run(lambda conn: self._count(conn, sql, *values))

    async def get_e2b_sandbox(self, sandbox_id: str) -> E2BSandbox | None:
        sql = f"SELECT {E2B_COLUMNS} FROM e2b_sandboxes WHERE sandbox_id=?"
        row = await self._run(lambda conn: self._one(conn, sql, sandbox_id))
        return None if row is None else _row(row)

    async def get_e2b_sandbox_and_deployment(
        self, sandbox_id: str
    ) -> tuple[E2BSandbox, Deployment] | None:
        """The sandbox's E2B row and its deployment; None if either is gone."""
        row = await self._run(lambda conn: self._one(conn, _WITH_DEPLOYMENT, sandbox_id))
        if row is None:
            return None
        width = len(E2B_COLUMNS.split(","))
        return _row(row[:width]), deployment(row[width:])

    async def list_e2b_sandboxes(
        self, *, deployment_id: str | None = None, ended_by: datetime | None = None
    ) -> list[E2BSandbox]:
        where: list[str] = ["1=1"]
        params: list[object] = []
        if deployment_id is not None:
            where.append("deployment_id=?")
            params.append(deployment_id)
        if ended_by is not None:
            where.append("end_at<=? AND paused_at IS NULL")
            params.append(ts(ended_by))
        sql = f"SELECT {E2B_COLUMNS} FROM e2b_sandboxes WHERE {' AND '.join(where)}"
        sql += " ORDER BY started_at, sandbox_id"
        rows = await self._run(lambda conn: conn.execute(self._sql(sql), params).fetchall())
        return [_row(r) for r in rows]

    async def set_e2b_end(self, sandbox_id: str, end_at: datetime) -> bool:
        sql = "UPDATE e2b_sandboxes SET end_at=? WHERE sandbox_id=?"
        return await self._run(lambda conn: self._count(conn, sql, ts(end_at), sandbox_id)) == 1

    async def set_e2b_paused(
        self, sandbox_id: str, paused_at: datetime | None, end_at: datetime | None = None
    ) -> bool:
        """Mark paused (``paused_at``) or running again (None, with its new end)."""
        paused = None if paused_at is None else ts(paused_at)
        if end_at is None:
            sql = "UPDATE e2b_sandboxes SET paused_at=? WHERE sandbox_id=?"
            params: tuple[object, ...] = (paused, sandbox_id)
        else:
            sql = "UPDATE e2b_sandboxes SET paused_at=?, end_at=? WHERE sandbox_id=?"
            params = (paused, ts(end_at), sandbox_id)
        return await self._run(lambda conn: self._count(conn, sql, *params)) == 1

    async def delete_e2b_sandbox(self, sandbox_id: str) -> None:
        sql = "DELETE FROM e2b_sandboxes WHERE sandbox_id=?"
        await self._run(lambda conn: self._count(conn, sql, sandbox_id))
