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

# ruff: noqa: S608 - the version table's name is a module constant; every value is a parameter.

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import psycopg
from psycopg import errors as pg_errors
from psycopg_pool import ConnectionPool

from podbay.domain import Sandbox
from podbay.errors import ApiError
from podbay.wire.codes import ErrorCode

from .sql import ActivityRow, SqlStore, migrations, statements

T = TypeVar("T")


#: Keys of ``pg_advisory_xact_lock(class, hash)``: one namespace per kind of lock.
_LOCK_MIGRATE = 0x706F6462  # "podb"
_LOCK_DEPLOYMENT = 1
_LOCK_ACCOUNT = 2

_VERSION_TABLE = "podbay_schema_version"
#: Tries of a transaction the database aborted to break a deadlock.
_ATTEMPTS = 5
#: Times a transaction whose connection died under it (PostgreSQL shutting
#: down or restarting: ``AdminShutdown``) runs again on a fresh one.
_RECONNECTS = 2
#: ``Retry-After`` of a request the store could not serve.
STORE_RETRY_SECONDS = 2


def _unavailable(exc: Exception, step: str) -> ApiError:
    """The store went away: a temporary refusal (503 with ``Retry-After``), not a 500."""
    when = {"connect": "could not be reached", "commit": "went away during the commit"}
    return ApiError(
        ErrorCode.STORE_UNAVAILABLE,
        f"the database {when.get(step, 'went away')} ({type(exc).__name__}); try again shortly",
        retry_after=STORE_RETRY_SECONDS,
    )


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


class PostgresStore(SqlStore[Conn]):
    """:class:`~podbay.store.base.Store` on a PostgreSQL database (queries in :mod:`.sql`)."""

    PARAM = "%s"
    GREATEST = "GREATEST"
    #: Byte order, as SQLite sorts: the same lists whatever the server's locale.
    BYTE_ORDER = ' COLLATE "C"'

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
            lost = 0
            for attempt in range(_ATTEMPTS):
                # Where a lost connection struck: before ``fn`` (no connection
                # came), in it (its transaction died uncommitted with the
                # connection: run it again on a fresh one), or in the commit
                # (whether it took is unknown: the caller hears 503).
                step = "connect"
                try:
                    with self._pool.connection() as conn:
                        step = "run"
                        result = fn(conn)
                        step = "commit"
                    return result
                except (pg_errors.DeadlockDetected, pg_errors.SerializationFailure):
                    if attempt == _ATTEMPTS - 1:
                        raise
                except psycopg.OperationalError as exc:
                    lost += 1
                    if step != "run" or lost > _RECONNECTS:
                        raise _unavailable(exc, step) from None
            raise AssertionError("unreachable")

        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, run)

    async def _run(self, fn: Callable[[Conn], T]) -> T:
        return await self._tx(fn)

    def _lock_for_insert(self, conn: Conn, s: Sandbox) -> None:
        # Deployment before account, always: two inserts never wait on each
        # other in opposite orders. Held to commit, so whoever comes next
        # counts (read committed: a fresh snapshot per statement) our row.
        conn.execute(
            "SELECT pg_advisory_xact_lock(%s, hashtext(%s))", (_LOCK_DEPLOYMENT, s.deployment_id)
        )
        conn.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))", (_LOCK_ACCOUNT, s.account))

    def _executemany(self, conn: Conn, sql: str, rows: Sequence[ActivityRow]) -> None:
        with conn.cursor() as cur:
            cur.executemany(sql.encode(), rows)

    async def close(self) -> None:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._executor, self._pool.close)
        self._executor.shutdown(wait=True)
