"""The embedded store: one SQLite file in WAL mode.

Every call runs on one dedicated thread holding one connection, so the
event loop never blocks on disk and the connection is never shared across
threads. WAL plus a busy timeout lets ``podbay deployment ...`` write while
``podbay serve`` runs.

>>> import asyncio, tempfile, pathlib
>>> async def demo():
...     store = SqliteStore.open(pathlib.Path(tempfile.mkdtemp()) / "podbay.db")
...     await store.set_meta("k", "v")
...     value = await store.get_meta("k")
...     await store.close()
...     return value
>>> asyncio.run(demo())
'v'
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from podbay.domain import Sandbox

from .sql import ActivityRow, SqlStore, migrations, statements

T = TypeVar("T")


def migrate(conn: sqlite3.Connection) -> int:
    """Apply every migration newer than ``PRAGMA user_version``; returns the version."""
    current = int(conn.execute("PRAGMA user_version").fetchone()[0])
    for version, sql in migrations():
        if version <= current:
            continue
        conn.execute("BEGIN IMMEDIATE")
        try:
            # Re-check under the write lock: another process may have migrated.
            (now,) = conn.execute("PRAGMA user_version").fetchone()
            if version > now:
                for statement in statements(sql):
                    conn.execute(statement)
                conn.execute(f"PRAGMA user_version = {int(version)}")
            conn.execute("COMMIT")
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        current = version
    return current


class SqliteStore(SqlStore[sqlite3.Connection]):
    """:class:`~podbay.store.base.Store` on one SQLite file (queries in :mod:`.sql`)."""

    def __init__(self, conn: sqlite3.Connection, executor: ThreadPoolExecutor) -> None:
        self._conn = conn
        self._executor = executor

    @classmethod
    def open(cls, path: Path) -> SqliteStore:
        path.parent.mkdir(parents=True, exist_ok=True)
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="podbay-store")

        def connect() -> sqlite3.Connection:
            conn = sqlite3.connect(
                path, isolation_level=None, check_same_thread=False, timeout=10.0
            )
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute("PRAGMA busy_timeout=10000")
            conn.execute("PRAGMA foreign_keys=ON")
            migrate(conn)
            return conn

        conn = executor.submit(connect).result()
        return cls(conn, executor)

    async def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, fn, self._conn)

    async def _tx(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        def run(conn: sqlite3.Connection) -> T:
            conn.execute("BEGIN IMMEDIATE")
            try:
                result = fn(conn)
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
            return result

        return await self._run(run)

    def _lock_for_insert(self, conn: sqlite3.Connection, s: Sandbox) -> None:
        """Nothing to take: ``BEGIN IMMEDIATE`` already made this the one writer,
        so the counts and the insert see one snapshot."""

    def _executemany(self, conn: sqlite3.Connection, sql: str, rows: Sequence[ActivityRow]) -> None:
        conn.executemany(sql, rows)

    async def close(self) -> None:
        def run(conn: sqlite3.Connection) -> None:
            conn.close()

        await self._run(run)
        self._executor.shutdown(wait=True)
