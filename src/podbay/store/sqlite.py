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

# ruff: noqa: S608 - column lists are module constants; every value is a parameter.

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from importlib import resources
from pathlib import Path
from typing import TypeVar

from podbay.domain import Deployment, Sandbox, SandboxState

from .base import InsertOutcome
from .rows import DEPLOYMENT_COLUMNS as _DEPLOYMENT_COLUMNS
from .rows import SANDBOX_COLUMNS as _SANDBOX_COLUMNS
from .rows import deployment as _deployment
from .rows import sandbox as _sandbox
from .rows import sandbox_values as _sandbox_values
from .rows import ts as _ts

T = TypeVar("T")


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


class SqliteStore:
    """:class:`~podbay.store.base.Store` on one SQLite file."""

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

    # -- deployments ---------------------------------------------------------
    async def add_deployment(self, deployment: Deployment) -> bool:
        d = deployment
        section = None if d.sandbox_section is None else json.dumps(d.sandbox_section)

        def run(conn: sqlite3.Connection) -> bool:
            try:
                conn.execute(
                    f"INSERT INTO deployments ({_DEPLOYMENT_COLUMNS}) VALUES (?,?,?,?,?,?,?)",
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
            except sqlite3.IntegrityError:
                return False
            return True

        return await self._run(run)

    async def update_deployment(self, deployment: Deployment) -> bool:
        d = deployment
        section = None if d.sandbox_section is None else json.dumps(d.sandbox_section)
        return await self._run(
            lambda conn: (
                conn.execute(
                    "UPDATE deployments SET spec_text=?, sandbox_section=?, account=?, updated_at=?"
                    " WHERE id=?",
                    (d.spec_text, section, d.account, _ts(d.updated_at), d.id),
                ).rowcount
                == 1
            )
        )

    async def get_deployment(self, deployment_id: str) -> Deployment | None:
        row = await self._run(
            lambda conn: conn.execute(
                f"SELECT {_DEPLOYMENT_COLUMNS} FROM deployments WHERE id=?", (deployment_id,)
            ).fetchone()
        )
        return None if row is None else _deployment(row)

    async def find_deployment(self, name: str) -> Deployment | None:
        row = await self._run(
            lambda conn: conn.execute(
                f"SELECT {_DEPLOYMENT_COLUMNS} FROM deployments WHERE name=?", (name,)
            ).fetchone()
        )
        return None if row is None else _deployment(row)

    async def list_deployments(self) -> list[Deployment]:
        rows = await self._run(
            lambda conn: conn.execute(
                f"SELECT {_DEPLOYMENT_COLUMNS} FROM deployments ORDER BY name"
            ).fetchall()
        )
        return [_deployment(r) for r in rows]

    async def remove_deployment(self, deployment_id: str) -> bool:
        def run(conn: sqlite3.Connection) -> bool:
            gone = (
                conn.execute("DELETE FROM deployments WHERE id=?", (deployment_id,)).rowcount == 1
            )
            conn.execute(
                "UPDATE sandboxes SET state='deleting', version=version+1"
                " WHERE deployment_id=? AND state!='deleting'",
                (deployment_id,),
            )
            return gone

        return await self._tx(run)

    # -- sandboxes -----------------------------------------------------------
    async def get_sandbox(self, deployment_id: str, name: str) -> Sandbox | None:
        row = await self._run(
            lambda conn: conn.execute(
                f"SELECT {_SANDBOX_COLUMNS} FROM sandboxes WHERE deployment_id=? AND name=?",
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
        where, args = [], []
        if deployment_id is not None:
            where.append("deployment_id=?")
            args.append(deployment_id)
        if states is not None:
            where.append(f"state IN ({','.join('?' * len(states))})")
            args.extend(s.value for s in states)
        sql = f"SELECT {_SANDBOX_COLUMNS} FROM sandboxes"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY created_at, name"
        rows = await self._run(lambda conn: conn.execute(sql, args).fetchall())
        return [_sandbox(r) for r in rows]

    async def insert_sandbox(
        self, sandbox: Sandbox, *, deployment_cap: int, account_cap: int
    ) -> InsertOutcome:
        s = sandbox

        def run(conn: sqlite3.Connection) -> InsertOutcome:
            # Inside BEGIN IMMEDIATE: counts and insert see one snapshot, one writer.
            exists = conn.execute(
                "SELECT 1 FROM sandboxes WHERE deployment_id=? AND name=?",
                (s.deployment_id, s.name),
            ).fetchone()
            if exists:
                return InsertOutcome.EXISTS
            (per_deployment,) = conn.execute(
                "SELECT count(*) FROM sandboxes WHERE deployment_id=? AND state!='deleting'",
                (s.deployment_id,),
            ).fetchone()
            if per_deployment >= deployment_cap:
                return InsertOutcome.DEPLOYMENT_CAP
            (per_account,) = conn.execute(
                "SELECT count(*) FROM sandboxes WHERE account=? AND state!='deleting'", (s.account,)
            ).fetchone()
            if per_account >= account_cap:
                return InsertOutcome.ACCOUNT_CAP
            conn.execute(
                f"INSERT INTO sandboxes ({_SANDBOX_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,0,?)",
                _sandbox_values(s),
            )
            return InsertOutcome.INSERTED

        return await self._tx(run)

    async def replace_sandbox(self, old: Sandbox, new: Sandbox) -> Sandbox | None:
        if new.id != old.id:
            raise ValueError("replace_sandbox: ids differ")

        def run(conn: sqlite3.Connection) -> Sandbox | None:
            values = _sandbox_values(new)[1:]
            changed = conn.execute(
                "UPDATE sandboxes SET deployment_id=?, account=?, name=?, class=?, state=?,"
                " machine_id=?, created_at=?, last_active_at=max(last_active_at, ?),"
                " started_at=?, ceiling_at=?, incarnation=?, suspended_at=?, version=version+1"
                " WHERE id=? AND version=?",
                (*values, old.id, old.version),
            ).rowcount
            if not changed:
                return None
            row = conn.execute(
                f"SELECT {_SANDBOX_COLUMNS} FROM sandboxes WHERE id=?", (old.id,)
            ).fetchone()
            return _sandbox(row)

        return await self._tx(run)

    async def delete_sandbox(self, sandbox: Sandbox) -> bool:
        return await self._run(
            lambda conn: (
                conn.execute(
                    "DELETE FROM sandboxes WHERE id=? AND version=?", (sandbox.id, sandbox.version)
                ).rowcount
                == 1
            )
        )

    async def record_activity(self, seen: Mapping[str, datetime]) -> None:
        if not seen:
            return
        rows = [(_ts(when), sandbox_id) for sandbox_id, when in seen.items()]

        def run(conn: sqlite3.Connection) -> None:
            # Not a version bump: activity never conflicts with a transition.
            conn.executemany(
                "UPDATE sandboxes SET last_active_at=max(last_active_at, ?) WHERE id=?", rows
            )

        await self._tx(run)

    # -- meta --------------------------------------------------------------------
    async def get_meta(self, key: str) -> str | None:
        row = await self._run(
            lambda conn: conn.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        )
        return None if row is None else str(row[0])

    async def set_meta(self, key: str, value: str) -> None:
        await self._run(
            lambda conn: conn.execute(
                "INSERT INTO meta (key, value) VALUES (?, ?)"
                " ON CONFLICT(key) DO UPDATE SET value=excluded.value",
                (key, value),
            )
        )

    async def close(self) -> None:
        def run(conn: sqlite3.Connection) -> None:
            conn.close()

        await self._run(run)
        self._executor.shutdown(wait=True)
