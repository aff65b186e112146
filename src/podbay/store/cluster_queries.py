"""The store's queries for split roles (``podbay control`` + ``podbay node``):
enrolled nodes, the shared signing keys, and leases.

A mixin of :class:`~podbay.store.sql.SqlStore` (same hooks, same SQL for
SQLite and PostgreSQL): every guarantee comes from one statement in the
database, so replicas need no lock of their own.
"""

# ruff: noqa: S608 - column lists are module constants; every value is a parameter.

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

from podbay.domain.node import NodeRecord

from .rows import at, ts

T = TypeVar("T")
NODE_COLUMNS = "name, url, drained, report, enrolled_at, heartbeat_at, credential_hash"


def _node(row: Sequence[Any]) -> NodeRecord:
    return NodeRecord(
        name=row[0],
        url=row[1],
        drained=bool(row[2]),
        report=json.loads(row[3]),
        enrolled_at=at(row[4]),
        heartbeat_at=at(row[5]),
        credential_hash=row[6],
    )


class ClusterQueries:
    if TYPE_CHECKING:  # provided by SqlStore, whose mixin this is

        async def _run(self, fn: Callable[[Any], T]) -> T: ...

        async def _tx(self, fn: Callable[[Any], T]) -> T: ...

        def _one(self, conn: Any, text: str, *params: Any) -> Any: ...

        def _count(self, conn: Any, text: str, *params: Any) -> int: ...

    # -- nodes -------------------------------------------------------------------
    async def enroll_node(
        self,
        name: str,
        url: str,
        credential_hash: str,
        report: dict[str, Any],
        now: datetime,
    ) -> bool:
        """Add the node; False if a node of that name is enrolled. A name is
        never taken over (nor its URL changed) by enrolling again: whoever
        holds the enrollment token could otherwise point an enrolled node's
        control calls at a machine of theirs. An operator frees the name with
        :meth:`forget_node`."""
        sql = (
            f"INSERT INTO nodes ({NODE_COLUMNS}) VALUES (?,?,0,?,?,?,?)"
            " ON CONFLICT (name) DO NOTHING"
        )
        values = (name, url, json.dumps(report), ts(now), ts(now), credential_hash)

        def run(conn: Any) -> bool:
            if self._count(conn, sql, *values) != 1:
                return False
            self._forget_routes(conn, name, report)
            return True

        return await self._tx(run)

    def _forget_routes(self, conn: Any, name: str, report: dict[str, Any]) -> None:
        """Routes published to an earlier process of the node are gone with it:
        their marks go in the same transaction that records the new boot, so
        no replica trusts one once it can read the new boot."""
        self._count(
            conn,
            "UPDATE sandboxes SET routed_on=NULL"
            " WHERE node=? AND routed_on IS NOT NULL AND routed_on<>?",
            name,
            str(report.get("boot", "")),
        )

    async def node_by_credential(self, credential_hash: str) -> NodeRecord | None:
        sql = f"SELECT {NODE_COLUMNS} FROM nodes WHERE credential_hash=?"
        row = await self._run(lambda conn: self._one(conn, sql, credential_hash))
        return None if row is None else _node(row)

    async def heartbeat_node(
        self, name: str, report: dict[str, Any], now: datetime
    ) -> NodeRecord | None:
        """Record a heartbeat; the record as it was before (None if forgotten)."""

        def run(conn: Any) -> NodeRecord | None:
            before = self._one(conn, f"SELECT {NODE_COLUMNS} FROM nodes WHERE name=?", name)
            if before is None:
                return None
            self._count(
                conn,
                "UPDATE nodes SET report=?, heartbeat_at=? WHERE name=?",
                json.dumps(report),
                ts(now),
                name,
            )
            if json.loads(before[3]).get("boot") != report.get("boot"):
                self._forget_routes(conn, name, report)
            return _node(before)

        return await self._tx(run)

    async def list_nodes(self) -> list[NodeRecord]:
        sql = f"SELECT {NODE_COLUMNS} FROM nodes ORDER BY name"
        rows = await self._run(lambda conn: conn.execute(sql, ()).fetchall())
        return [_node(r) for r in rows]

    async def drain_node(self, name: str, drained: bool = True) -> bool:
        sql = "UPDATE nodes SET drained=? WHERE name=?"
        return await self._run(lambda conn: self._count(conn, sql, int(drained), name) == 1)

    async def held_by_node(self) -> dict[str, int]:
        """Sandboxes each node holds (creating, running or suspended)."""
        sql = (
            "SELECT node, count(*) FROM sandboxes"
            " WHERE state IN ('creating', 'running', 'suspended') GROUP BY node"
        )
        rows = await self._run(lambda conn: conn.execute(sql, ()).fetchall())
        return {str(r[0]): int(r[1]) for r in rows}

    async def drop_node_sandboxes(self, name: str) -> int:
        """Forget every sandbox the node held (an operator gave them up)."""
        sql = "DELETE FROM sandboxes WHERE node=?"
        return await self._run(lambda conn: self._count(conn, sql, name))

    async def forget_node(self, name: str) -> bool:
        """Remove the node and the record of every sandbox it held, at once."""

        def run(conn: Any) -> bool:
            self._count(conn, "DELETE FROM sandboxes WHERE node=?", name)
            return self._count(conn, "DELETE FROM nodes WHERE name=?", name) == 1

        return await self._tx(run)

    # -- signing keys --------------------------------------------------------------
    async def signing_keys(self) -> list[tuple[str, str]]:
        """(kid, private PEM) of every key, oldest first."""
        sql = "SELECT kid, private_pem FROM signing_keys ORDER BY kid"
        rows = await self._run(lambda conn: conn.execute(sql, ()).fetchall())
        return [(str(r[0]), str(r[1])) for r in rows]

    async def add_signing_key(self, kid: str, pem: str, now: datetime) -> None:
        sql = (
            "INSERT INTO signing_keys (kid, private_pem, created_at) VALUES (?,?,?)"
            " ON CONFLICT DO NOTHING"
        )
        await self._run(lambda conn: self._count(conn, sql, kid, pem, ts(now)))

    async def remove_signing_key(self, kid: str) -> bool:
        sql = "DELETE FROM signing_keys WHERE kid=?"
        return await self._run(lambda conn: self._count(conn, sql, kid) == 1)

    # -- leases ------------------------------------------------------------------------
    async def take_lease(self, key: str, holder: str, seconds: float, now: datetime) -> bool:
        """Hold ``key`` until ``now + seconds`` if it is free, expired or already
        ours (a renewal); False while somebody else holds it."""
        sql = (
            "INSERT INTO leases (key, holder, until) VALUES (?,?,?)"
            " ON CONFLICT (key) DO UPDATE SET holder=excluded.holder, until=excluded.until"
            " WHERE leases.until < ? OR leases.holder = excluded.holder"
        )
        until, current = now.timestamp() + seconds, now.timestamp()
        return await self._run(
            lambda conn: self._count(conn, sql, key, holder, until, current) == 1
        )

    async def drop_lease(self, key: str, holder: str) -> None:
        sql = "DELETE FROM leases WHERE key=? AND holder=?"
        await self._run(lambda conn: self._count(conn, sql, key, holder))
