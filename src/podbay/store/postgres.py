"""The shared store: PostgreSQL, for servers that share one state.

Same records, same migrations and same guarantees as :mod:`.sqlite`, but
every guarantee comes from the database, never from a lock in this process,
because two servers (replicas) each hold their own :class:`PostgresStore`:

- a sandbox write is ``UPDATE ... WHERE id = .. AND version = ..``: the row
  lock makes the second of two racing writers re-check the version and miss;
- an insert takes transaction-scoped advisory locks on its deployment and its
  account before counting, so racing inserts of one name end with one row and
  never pass a cap together;
- migrations run under one advisory lock, in one transaction each.

Calls run on a small thread pool over a psycopg connection pool, like the
SQLite store's thread: independent of any event loop, so ``serve`` can open
the store before its loop starts and close it after.
"""

# ruff: noqa: S608 - column lists are module constants; every value is a parameter.

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any, TypeVar

import psycopg
from psycopg import errors as pg_errors
from psycopg_pool import ConnectionPool

from podbay.domain import Deployment, Sandbox, SandboxState

from .base import InsertOutcome
from .rows import DEPLOYMENT_COLUMNS as _DEPLOYMENT_COLUMNS
from .rows import SANDBOX_COLUMNS as _SANDBOX_COLUMNS
from .rows import deployment as _deployment
from .rows import sandbox as _sandbox
from .rows import sandbox_values as _sandbox_values
from .rows import ts as _ts
from .sqlite import migrations, statements

T = TypeVar("T")


#: Keys of ``pg_advisory_xact_lock(class, hash)``: one namespace per kind of lock.
_LOCK_MIGRATE = 0x706F6462  # "podb"
_LOCK_DEPLOYMENT = 1
_LOCK_ACCOUNT = 2

_VERSION_TABLE = "podbay_schema_version"
#: Tries of a transaction the database aborted to break a deadlock.
_ATTEMPTS = 5


def dialect(sql: str) -> str:
    """A migration written for SQLite, as PostgreSQL runs it.

    The one difference the migrations use: SQLite's ``REAL`` is 8 bytes,
    PostgreSQL's 4 (unix seconds would lose whole minutes), so it becomes
    ``DOUBLE PRECISION``. Everything else in ``migrations/`` is SQL both run.

    >>> dialect("created_at REAL NOT NULL, realm TEXT")
    'created_at DOUBLE PRECISION NOT NULL, realm TEXT'
    """
    return re.sub(r"\bREAL\b", "DOUBLE PRECISION", sql)


def migrate(conn: psycopg.Connection[Any]) -> int:
    """Apply every migration newer than the recorded version; returns the version.

    Safe with many servers starting at once: the advisory lock makes them
    take turns, and each re-reads the version under it.
    """
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_MIGRATE,))
        conn.execute(f"CREATE TABLE IF NOT EXISTS {_VERSION_TABLE} (version INTEGER NOT NULL)")
        row = conn.execute(f"SELECT max(version) FROM {_VERSION_TABLE}").fetchone()
        current = int(row[0]) if row and row[0] is not None else 0
        for version, sql in migrations():
            if version <= current:
                continue
            for statement in statements(dialect(sql)):
                conn.execute(statement.encode())
            conn.execute(f"DELETE FROM {_VERSION_TABLE}")
            conn.execute(f"INSERT INTO {_VERSION_TABLE} (version) VALUES (%s)", (version,))
            current = version
    return current


Conn = psycopg.Connection[tuple[Any, ...]]


class PostgresStore:
    """:class:`~podbay.store.base.Store` on a PostgreSQL database."""

    def __init__(self, pool: ConnectionPool[Conn], executor: ThreadPoolExecutor) -> None:
        self._pool = pool
        self._executor = executor

    @classmethod
    def open(cls, url: str, *, connections: int = 4) -> PostgresStore:
        """Connect, migrate, and keep up to ``connections`` connections."""
        with psycopg.connect(url, autocommit=True) as conn:
            migrate(conn)
        # Checked at each checkout (one round trip): after the database restarts
        # or fails over, the next call gets a fresh connection, not an error.
        pool: ConnectionPool[Conn] = ConnectionPool(
            url,
            min_size=1,
            max_size=connections,
            open=False,
            name="podbay-store",
            check=ConnectionPool.check_connection,
        )
        pool.open(wait=True, timeout=30.0)
        executor = ThreadPoolExecutor(max_workers=connections, thread_name_prefix="podbay-store")
        return cls(pool, executor)

    async def _tx(self, fn: Callable[[Conn], T]) -> T:
        """Run ``fn`` in one transaction (committed unless it raises).

        A transaction PostgreSQL aborts to break a deadlock (another server
        locking the same rows in another order) ran nothing: run it again.
        """

        def run() -> T:
            for attempt in range(_ATTEMPTS):
                try:
                    with self._pool.connection() as conn:
                        return fn(conn)
                except (pg_errors.DeadlockDetected, pg_errors.SerializationFailure):
                    if attempt == _ATTEMPTS - 1:
                        raise
            raise AssertionError("unreachable")

        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, run)

    # -- deployments ---------------------------------------------------------
    async def add_deployment(self, deployment: Deployment) -> bool:
        d = deployment
        section = None if d.sandbox_section is None else json.dumps(d.sandbox_section)

        def run(conn: Conn) -> bool:
            cur = conn.execute(
                f"INSERT INTO deployments ({_DEPLOYMENT_COLUMNS})"
                " VALUES (%s,%s,%s,%s,%s,%s,%s) ON CONFLICT DO NOTHING",
                (
                    d.id,
                    d.name,
                    d.account,
                    d.spec_text,
                    section,
                    _ts(d.created_at),
                    _ts(d.updated_at),
                ),
            )
            return cur.rowcount == 1

        return await self._tx(run)

    async def update_deployment(self, deployment: Deployment) -> bool:
        d = deployment
        section = None if d.sandbox_section is None else json.dumps(d.sandbox_section)
        return await self._tx(
            lambda conn: (
                conn.execute(
                    "UPDATE deployments SET spec_text=%s, sandbox_section=%s, account=%s,"
                    " updated_at=%s WHERE id=%s",
                    (d.spec_text, section, d.account, _ts(d.updated_at), d.id),
                ).rowcount
                == 1
            )
        )

    async def get_deployment(self, deployment_id: str) -> Deployment | None:
        row = await self._tx(
            lambda conn: conn.execute(
                f"SELECT {_DEPLOYMENT_COLUMNS} FROM deployments WHERE id=%s", (deployment_id,)
            ).fetchone()
        )
        return None if row is None else _deployment(row)

    async def find_deployment(self, name: str) -> Deployment | None:
        row = await self._tx(
            lambda conn: conn.execute(
                f"SELECT {_DEPLOYMENT_COLUMNS} FROM deployments WHERE name=%s", (name,)
            ).fetchone()
        )
        return None if row is None else _deployment(row)

    async def list_deployments(self) -> list[Deployment]:
        # Byte order, as SQLite sorts: the same list whatever the server's locale.
        rows = await self._tx(
            lambda conn: conn.execute(
                f'SELECT {_DEPLOYMENT_COLUMNS} FROM deployments ORDER BY name COLLATE "C"'
            ).fetchall()
        )
        return [_deployment(r) for r in rows]

    async def remove_deployment(self, deployment_id: str) -> bool:
        def run(conn: Conn) -> bool:
            gone = (
                conn.execute("DELETE FROM deployments WHERE id=%s", (deployment_id,)).rowcount == 1
            )
            conn.execute(
                "UPDATE sandboxes SET state='deleting', version=version+1"
                " WHERE deployment_id=%s AND state<>'deleting'",
                (deployment_id,),
            )
            return gone

        return await self._tx(run)

    # -- sandboxes -----------------------------------------------------------
    async def get_sandbox(self, deployment_id: str, name: str) -> Sandbox | None:
        row = await self._tx(
            lambda conn: conn.execute(
                f"SELECT {_SANDBOX_COLUMNS} FROM sandboxes WHERE deployment_id=%s AND name=%s",
                (deployment_id, name),
            ).fetchone()
        )
        return None if row is None else _sandbox(row)

    async def list_sandboxes(
        self,
        *,
        deployment_id: str | None = None,
        states: Sequence[SandboxState] | None = None,
    ) -> list[Sandbox]:
        where: list[str] = []
        args: list[Any] = []
        if deployment_id is not None:
            where.append("deployment_id=%s")
            args.append(deployment_id)
        if states is not None:
            where.append("state = ANY(%s)")
            args.append([s.value for s in states])
        sql = f"SELECT {_SANDBOX_COLUMNS} FROM sandboxes"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += ' ORDER BY created_at, name COLLATE "C"'
        rows = await self._tx(lambda conn: conn.execute(sql.encode(), args).fetchall())
        return [_sandbox(r) for r in rows]

    async def insert_sandbox(
        self, sandbox: Sandbox, *, deployment_cap: int, account_cap: int
    ) -> InsertOutcome:
        s = sandbox

        def run(conn: Conn) -> InsertOutcome:
            # Deployment before account, always: two inserts never wait on each
            # other in opposite orders. Held to commit, so whoever comes next
            # counts (read committed: a fresh snapshot per statement) our row.
            conn.execute(
                "SELECT pg_advisory_xact_lock(%s, hashtext(%s))",
                (_LOCK_DEPLOYMENT, s.deployment_id),
            )
            conn.execute(
                "SELECT pg_advisory_xact_lock(%s, hashtext(%s))", (_LOCK_ACCOUNT, s.account)
            )
            exists = conn.execute(
                "SELECT 1 FROM sandboxes WHERE deployment_id=%s AND name=%s",
                (s.deployment_id, s.name),
            ).fetchone()
            if exists:
                return InsertOutcome.EXISTS
            counted = conn.execute(
                "SELECT count(*) FROM sandboxes WHERE deployment_id=%s AND state<>'deleting'",
                (s.deployment_id,),
            ).fetchone()
            if counted is not None and counted[0] >= deployment_cap:
                return InsertOutcome.DEPLOYMENT_CAP
            counted = conn.execute(
                "SELECT count(*) FROM sandboxes WHERE account=%s AND state<>'deleting'",
                (s.account,),
            ).fetchone()
            if counted is not None and counted[0] >= account_cap:
                return InsertOutcome.ACCOUNT_CAP
            try:
                with conn.transaction():  # a savepoint: the unique index is the last word
                    conn.execute(
                        f"INSERT INTO sandboxes ({_SANDBOX_COLUMNS})"
                        " VALUES (%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,%s,0,%s)",
                        _sandbox_values(s),
                    )
            except pg_errors.UniqueViolation as exc:
                if exc.diag.constraint_name == "sandboxes_deployment_id_name_key":
                    return InsertOutcome.EXISTS
                raise
            return InsertOutcome.INSERTED

        return await self._tx(run)

    async def replace_sandbox(self, old: Sandbox, new: Sandbox) -> Sandbox | None:
        if new.id != old.id:
            raise ValueError("replace_sandbox: ids differ")
        values = _sandbox_values(new)[1:]
        row = await self._tx(
            lambda conn: conn.execute(
                "UPDATE sandboxes SET deployment_id=%s, account=%s, name=%s, class=%s, state=%s,"
                " machine_id=%s, created_at=%s, last_active_at=GREATEST(last_active_at, %s),"
                " started_at=%s, ceiling_at=%s, incarnation=%s, suspended_at=%s,"
                f" version=version+1 WHERE id=%s AND version=%s RETURNING {_SANDBOX_COLUMNS}",
                (*values, old.id, old.version),
            ).fetchone()
        )
        return None if row is None else _sandbox(row)

    async def delete_sandbox(self, sandbox: Sandbox) -> bool:
        return await self._tx(
            lambda conn: (
                conn.execute(
                    "DELETE FROM sandboxes WHERE id=%s AND version=%s",
                    (sandbox.id, sandbox.version),
                ).rowcount
                == 1
            )
        )

    async def record_activity(self, seen: Mapping[str, datetime]) -> None:
        if not seen:
            return
        # In id order: two servers recording overlapping sets lock rows in one
        # order, so they wait for each other instead of deadlocking.
        rows = [(_ts(seen[sandbox_id]), sandbox_id) for sandbox_id in sorted(seen)]

        def run(conn: Conn) -> None:
            with conn.cursor() as cur:
                cur.executemany(
                    "UPDATE sandboxes SET last_active_at=GREATEST(last_active_at, %s) WHERE id=%s",
                    rows,
                )

        await self._tx(run)

    # -- meta --------------------------------------------------------------------
    async def get_meta(self, key: str) -> str | None:
        row = await self._tx(
            lambda conn: conn.execute("SELECT value FROM meta WHERE key=%s", (key,)).fetchone()
        )
        return None if row is None else str(row[0])

    async def set_meta(self, key: str, value: str) -> None:
        await self._tx(
            lambda conn: conn.execute(
                "INSERT INTO meta (key, value) VALUES (%s, %s)"
                " ON CONFLICT (key) DO UPDATE SET value=excluded.value",
                (key, value),
            )
        )

    async def close(self) -> None:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._executor, self._pool.close)
        self._executor.shutdown(wait=True)
