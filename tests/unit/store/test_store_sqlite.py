from __future__ import annotations

import asyncio
import sqlite3
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from podbay.domain import Deployment, Sandbox, SandboxState
from podbay.store.base import InsertOutcome
from podbay.store.sqlite import SqliteStore, migrate, migrations

pytestmark = pytest.mark.anyio
T0 = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def store(tmp_path):
    s = SqliteStore.open(tmp_path / "podbay.db")
    yield s
    await s.close()


def _dep(name="d", account="acct", section=None) -> Deployment:
    return Deployment(id=f"dep_{name}", name=name, account=account, spec_text="x: 1",
                      sandbox_section=section, created_at=T0, updated_at=T0)


def _sb(name, dep="dep_d", account="acct", state=SandboxState.CREATING) -> Sandbox:
    return Sandbox(id=f"sb-{dep}-{name}", deployment_id=dep, account=account, name=name,
                   class_="default", state=state, machine_id=f"m-{dep}-{name}".replace("_", "-"),
                   created_at=T0, last_active_at=T0, started_at=None, ceiling_at=None)


def test_migrations_numbered_and_recorded(tmp_path):
    versions = [v for v, _ in migrations()]
    assert versions == sorted(set(versions)) and versions[0] == 1
    conn = sqlite3.connect(tmp_path / "x.db", isolation_level=None)
    assert migrate(conn) == versions[-1]
    assert migrate(conn) == versions[-1]  # idempotent
    assert conn.execute("PRAGMA user_version").fetchone()[0] == versions[-1]


async def test_wal_mode(store, tmp_path):
    conn = sqlite3.connect(tmp_path / "podbay.db")
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


async def test_deployments_roundtrip(store):
    d = _dep(section={"toolchain": "never"})
    assert await store.add_deployment(d)
    assert not await store.add_deployment(replace(d, id="dep_other"))  # name taken
    assert await store.get_deployment(d.id) == d
    assert await store.find_deployment("d") == d
    newer = replace(d, sandbox_section=None, updated_at=T0 + timedelta(seconds=1))
    assert await store.update_deployment(newer)
    assert (await store.get_deployment(d.id)).sandbox_section is None
    assert [x.name for x in await store.list_deployments()] == ["d"]


async def test_remove_deployment_marks_sandboxes_deleting(store):
    await store.add_deployment(_dep())
    await store.insert_sandbox(_sb("a"), deployment_cap=9, account_cap=9)
    assert await store.remove_deployment("dep_d")
    assert await store.get_deployment("dep_d") is None
    (row,) = await store.list_sandboxes()
    assert row.state is SandboxState.DELETING


async def test_insert_unique_and_caps(store):
    assert await store.insert_sandbox(_sb("a"), deployment_cap=2, account_cap=3) == \
        InsertOutcome.INSERTED
    assert await store.insert_sandbox(replace(_sb("a"), id="sb-x", machine_id="m-x"),
                                      deployment_cap=2, account_cap=3) == InsertOutcome.EXISTS
    assert await store.insert_sandbox(_sb("b"), deployment_cap=2, account_cap=3) == \
        InsertOutcome.INSERTED
    assert await store.insert_sandbox(_sb("c"), deployment_cap=2, account_cap=3) == \
        InsertOutcome.DEPLOYMENT_CAP
    assert await store.insert_sandbox(_sb("c", dep="dep_e"), deployment_cap=2,
                                      account_cap=3) == InsertOutcome.INSERTED
    assert await store.insert_sandbox(_sb("d", dep="dep_f"), deployment_cap=2,
                                      account_cap=3) == InsertOutcome.ACCOUNT_CAP
    # deleting rows do not count
    row = await store.get_sandbox("dep_d", "a")
    await store.replace_sandbox(row, row.moved(SandboxState.DELETING))
    assert await store.insert_sandbox(_sb("d", dep="dep_f"), deployment_cap=2,
                                      account_cap=3) == InsertOutcome.INSERTED


async def test_concurrent_inserts_never_pass_a_cap(tmp_path):
    stores = [SqliteStore.open(tmp_path / "shared.db") for _ in range(4)]
    try:
        outcomes = await asyncio.gather(*(
            stores[i % 4].insert_sandbox(_sb(f"n{i}"), deployment_cap=5, account_cap=99)
            for i in range(20)))
        assert outcomes.count(InsertOutcome.INSERTED) == 5
        assert len(await stores[0].list_sandboxes()) == 5
    finally:
        for s in stores:
            await s.close()


async def test_compare_and_set(store):
    await store.insert_sandbox(_sb("a"), deployment_cap=9, account_cap=9)
    row = await store.get_sandbox("dep_d", "a")
    assert row.version == 0
    running = await store.replace_sandbox(row, row.started(T0, timedelta(hours=8)))
    assert running is not None and running.version == 1
    assert running.ceiling_at == T0 + timedelta(hours=8) and running.incarnation == 1
    # a writer holding the old version loses
    assert await store.replace_sandbox(row, row.moved(SandboxState.DELETING)) is None
    assert not await store.delete_sandbox(row)
    assert await store.delete_sandbox(running)
    assert await store.get_sandbox("dep_d", "a") is None


async def test_activity_only_moves_forward(store):
    await store.insert_sandbox(_sb("a"), deployment_cap=9, account_cap=9)
    row = await store.get_sandbox("dep_d", "a")
    await store.record_activity({row.id: T0 + timedelta(seconds=10)})
    await store.record_activity({row.id: T0 + timedelta(seconds=5)})
    again = await store.get_sandbox("dep_d", "a")
    assert again.last_active_at == T0 + timedelta(seconds=10)
    assert again.version == row.version  # activity is no transition
    # a transition written with an older last_active_at does not roll it back
    moved = await store.replace_sandbox(again, again.started(T0, timedelta(hours=1)))
    assert moved.last_active_at == T0 + timedelta(seconds=10)


async def test_list_filters(store):
    await store.insert_sandbox(_sb("a"), deployment_cap=9, account_cap=9)
    await store.insert_sandbox(_sb("b", dep="dep_e"), deployment_cap=9, account_cap=9)
    assert [s.name for s in await store.list_sandboxes(deployment_id="dep_e")] == ["b"]
    assert await store.list_sandboxes(states=[SandboxState.RUNNING]) == []
    assert len(await store.list_sandboxes(states=[SandboxState.CREATING])) == 2


async def test_meta(store):
    assert await store.get_meta("public_url") is None
    await store.set_meta("public_url", "http://a")
    await store.set_meta("public_url", "http://b")
    assert await store.get_meta("public_url") == "http://b"


async def test_sandboxes_from_before_classes_are_containers(tmp_path):
    """Every sandbox made before classes existed runs in the container class."""
    path = tmp_path / "old.db"
    old = SqliteStore.open(path)
    assert await old.add_deployment(_dep())
    assert await old.insert_sandbox(_sb("a"), deployment_cap=5, account_cap=5) is \
        InsertOutcome.INSERTED  # written with class "default", as before classes
    await old.close()
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA user_version = 2")  # the schema before classes
    conn.close()
    upgraded = SqliteStore.open(path)
    row = await upgraded.get_sandbox("dep_d", "a")
    await upgraded.close()
    assert row is not None and row.class_ == "container"
