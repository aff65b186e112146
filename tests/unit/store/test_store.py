from __future__ import annotations

import asyncio
import sqlite3
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from podbay.domain import Deployment, Sandbox, SandboxState
from podbay.errors import ApiError
from podbay.store import postgres
from podbay.store.base import InsertOutcome
from podbay.store.postgres import PostgresStore, dialect
from podbay.store.sql import migrations
from podbay.store.sqlite import SqliteStore, migrate
from podbay.testing.records import sandbox_record
from podbay.wire.codes import ErrorCode

pytestmark = pytest.mark.anyio
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _dep(name="d", account="acct", section=None) -> Deployment:
    return Deployment(
        id=f"dep_{name}",
        name=name,
        account=account,
        spec_text="x: 1",
        sandbox_section=section,
        created_at=T0,
        updated_at=T0,
    )


def _sb(name, dep="dep_d", account="acct", state=SandboxState.CREATING) -> Sandbox:
    return sandbox_record(
        name, deployment=dep, account=account, state=state, class_="default", at=T0
    )


async def test_migrations_numbered_and_recorded(tmp_path):
    versions = [v for v, _ in migrations()]
    assert versions == sorted(set(versions))
    assert versions[0] == 1
    conn = sqlite3.connect(tmp_path / "x.db", isolation_level=None)
    assert migrate(conn) == versions[-1]
    assert migrate(conn) == versions[-1]  # idempotent
    assert conn.execute("PRAGMA user_version").fetchone()[0] == versions[-1]


async def test_wal_mode(tmp_path):
    store = SqliteStore.open(tmp_path / "podbay.db")
    await store.close()
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


async def test_sandbox_options_roundtrip(store):
    """Attach's options are kept with the row, through insert and replace."""
    from dataclasses import replace

    from podbay.domain import SandboxOptions

    assert await store.add_deployment(_dep())
    options = SandboxOptions(
        labels={"team": "a"}, env={"A": "1"}, cpus=0.5, memory_mib=512, idle_timeout_seconds=90
    )
    row = replace(_sb("o"), options=options)
    assert (
        await store.insert_sandbox(row, deployment_cap=5, account_cap=5) is InsertOutcome.INSERTED
    )
    got = await store.get_sandbox("dep_d", "o")
    assert got is not None
    assert got.options == options
    moved = await store.replace_sandbox(got, got.moved(SandboxState.RUNNING))
    assert moved is not None
    assert moved.options == options
    plain = _sb("p")
    await store.insert_sandbox(plain, deployment_cap=5, account_cap=5)
    got_plain = await store.get_sandbox("dep_d", "p")
    assert got_plain is not None
    assert got_plain.options == SandboxOptions()


async def test_insert_unique_and_caps(store):
    assert (
        await store.insert_sandbox(_sb("a"), deployment_cap=2, account_cap=3)
        == InsertOutcome.INSERTED
    )
    assert (
        await store.insert_sandbox(
            replace(_sb("a"), id="sb-x", machine_id="m-x"), deployment_cap=2, account_cap=3
        )
        == InsertOutcome.EXISTS
    )
    assert (
        await store.insert_sandbox(_sb("b"), deployment_cap=2, account_cap=3)
        == InsertOutcome.INSERTED
    )
    assert (
        await store.insert_sandbox(_sb("c"), deployment_cap=2, account_cap=3)
        == InsertOutcome.DEPLOYMENT_CAP
    )
    assert (
        await store.insert_sandbox(_sb("c", dep="dep_e"), deployment_cap=2, account_cap=3)
        == InsertOutcome.INSERTED
    )
    assert (
        await store.insert_sandbox(_sb("d", dep="dep_f"), deployment_cap=2, account_cap=3)
        == InsertOutcome.ACCOUNT_CAP
    )
    # deleting rows do not count
    row = await store.get_sandbox("dep_d", "a")
    await store.replace_sandbox(row, row.moved(SandboxState.DELETING))
    assert (
        await store.insert_sandbox(_sb("d", dep="dep_f"), deployment_cap=2, account_cap=3)
        == InsertOutcome.INSERTED
    )


async def test_concurrent_inserts_never_pass_a_cap(new_store):
    stores = [new_store() for _ in range(4)]
    outcomes = await asyncio.gather(
        *(
            stores[i % 4].insert_sandbox(_sb(f"n{i}"), deployment_cap=5, account_cap=99)
            for i in range(20)
        )
    )
    assert outcomes.count(InsertOutcome.INSERTED) == 5
    assert len(await stores[0].list_sandboxes()) == 5


async def test_concurrent_inserts_never_pass_an_account_cap(new_store):
    stores = [new_store() for _ in range(4)]
    outcomes = await asyncio.gather(
        *(
            stores[i % 4].insert_sandbox(_sb("n", dep=f"dep_{i}"), deployment_cap=99, account_cap=3)
            for i in range(24)
        )
    )
    assert outcomes.count(InsertOutcome.INSERTED) == 3
    assert outcomes.count(InsertOutcome.ACCOUNT_CAP) == 21


async def test_two_instances_racing_for_one_name_make_one_sandbox(new_store):
    """As two replicas attaching one new name at once: one row, the rest see it."""
    first, second = new_store(), new_store()
    racers = [
        (first if i % 2 else second).insert_sandbox(
            replace(_sb("shared"), id=f"sb-{i}", machine_id=f"m-{i}"),
            deployment_cap=99,
            account_cap=99,
        )
        for i in range(30)
    ]
    outcomes = await asyncio.gather(*racers)
    assert outcomes.count(InsertOutcome.INSERTED) == 1
    assert outcomes.count(InsertOutcome.EXISTS) == 29
    rows = await first.list_sandboxes()
    assert [r.name for r in rows] == ["shared"]
    assert await second.get_sandbox("dep_d", "shared") == rows[0]


async def test_exactly_one_racing_transition_wins(new_store):
    """Many writers (on two instances) holding one version: exactly one writes."""
    first, second = new_store(), new_store()
    await first.insert_sandbox(_sb("a"), deployment_cap=9, account_cap=9)
    row = await second.get_sandbox("dep_d", "a")
    # Half start it (each with its own ceiling), half delete it: one of them wins.
    wanted = [
        row.started(T0, timedelta(hours=i)) if i % 3 else row.moved(SandboxState.DELETING)
        for i in range(24)
    ]
    results = await asyncio.gather(
        *((first if i % 2 else second).replace_sandbox(row, new) for i, new in enumerate(wanted))
    )
    winners = [r for r in results if r is not None]
    assert len(winners) == 1
    assert winners[0].version == row.version + 1
    assert await first.get_sandbox("dep_d", "a") == winners[0]


async def test_compare_and_set(store):
    await store.insert_sandbox(_sb("a"), deployment_cap=9, account_cap=9)
    row = await store.get_sandbox("dep_d", "a")
    assert row.version == 0
    running = await store.replace_sandbox(row, row.started(T0, timedelta(hours=8)))
    assert running is not None
    assert running.version == 1
    assert running.ceiling_at == T0 + timedelta(hours=8)
    assert running.incarnation == 1
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


async def test_a_route_mark_holds_only_for_the_running_version_it_names(store):
    await store.insert_sandbox(_sb("a"), deployment_cap=9, account_cap=9)
    creating = await store.get_sandbox("dep_d", "a")
    assert creating.routed_on is None
    assert not await store.mark_routed(creating, "boot-1")  # not running
    running = await store.replace_sandbox(creating, creating.started(T0, timedelta(hours=1)))
    assert await store.mark_routed(running, "boot-1")
    marked = await store.get_sandbox("dep_d", "a")
    assert marked.routed_on == "boot-1"
    assert marked.version == running.version
    await store.clear_routed(running.id)
    assert (await store.get_sandbox("dep_d", "a")).routed_on is None
    assert await store.mark_routed(running, "boot-2")
    # Every compare-and-set write forgets it; a mark of an older version is refused.
    suspended = await store.replace_sandbox(marked, marked.released(SandboxState.SUSPENDED, T0))
    assert suspended is not None
    assert suspended.routed_on is None
    resumed = await store.replace_sandbox(suspended, suspended.moved(SandboxState.RUNNING))
    assert resumed is not None
    assert resumed.routed_on is None
    assert not await store.mark_routed(running, "boot-2")
    assert (await store.get_sandbox("dep_d", "a")).routed_on is None


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


async def test_sandboxes_from_before_classes_are_containers(new_store, store_kind, store_target):
    """Every sandbox made before classes existed runs in the container class."""
    old = new_store()
    assert await old.add_deployment(_dep())
    assert (
        await old.insert_sandbox(_sb("a"), deployment_cap=5, account_cap=5)
        is InsertOutcome.INSERTED
    )  # written with class "default", as before classes
    _rewind(store_kind, store_target, 2)  # the schema before classes
    upgraded = new_store()
    row = await upgraded.get_sandbox("dep_d", "a")
    assert row is not None
    assert row.class_ == "container"


#: What undoes each migration after the classes one, newest first, so that
#: rewinding the recorded version lets the later migrations run again.
_UNDO = [
    (
        10,
        [
            "ALTER TABLE e2b_sandboxes DROP COLUMN paused_at",
            "ALTER TABLE e2b_sandboxes DROP COLUMN on_timeout",
        ],
    ),
    (9, ["DROP TABLE sandbox_events"]),
    (8, ["DROP TABLE e2b_sandboxes", "DROP TABLE e2b_keys"]),
    (7, ["ALTER TABLE sandboxes DROP COLUMN options"]),
    (6, ["ALTER TABLE sandboxes DROP COLUMN asked_class"]),
    (5, ["ALTER TABLE sandboxes DROP COLUMN routed_on"]),
    (
        4,
        [
            "DROP INDEX sandboxes_node",
            "ALTER TABLE sandboxes DROP COLUMN node",
            "DROP TABLE nodes",
            "DROP TABLE signing_keys",
            "DROP TABLE leases",
        ],
    ),
]


def _rewind(kind: str, target: str, version: int) -> None:
    undo = [sql for v, steps in _UNDO if v > version for sql in steps]
    if kind == "sqlite":
        conn = sqlite3.connect(target, isolation_level=None)
        for sql in undo:
            conn.execute(sql)
        conn.execute(f"PRAGMA user_version = {version}")
        conn.close()
        return
    with psycopg.connect(target, autocommit=True) as pg:
        for sql in undo:
            pg.execute(sql.encode())
        pg.execute(f"UPDATE podbay_schema_version SET version = {version}".encode())


def _columns(kind: str, target: str) -> dict[str, list[tuple[str, str]]]:
    """Table → [(column, type family)] as the database itself reports them."""

    def family(declared: str) -> str:
        declared = declared.lower()
        return (
            "number"
            if declared in {"real", "double precision"}
            else "integer"
            if declared in {"integer"}
            else declared
        )

    out: dict[str, list[tuple[str, str]]] = {}
    if kind == "sqlite":
        conn = sqlite3.connect(target)
        tables = [
            r[0]
            for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table' ORDER BY name")
        ]
        for table in tables:
            out[table] = [(r[1], family(r[2])) for r in conn.execute(f"PRAGMA table_info({table})")]
        conn.close()
        return out
    with psycopg.connect(target) as pg:
        for table, column, kind_ in pg.execute(
            "SELECT table_name, column_name, data_type FROM information_schema.columns"
            " WHERE table_schema='public' AND table_name <> 'podbay_schema_version'"
            " ORDER BY table_name, ordinal_position"
        ):
            out.setdefault(table, []).append((column, family(kind_)))
    return out


async def test_one_migration_set_builds_the_same_schema_on_both(tmp_path, postgres_cluster):
    """The migrations serve both dialects: same tables, columns, order and types."""
    lite = SqliteStore.open(tmp_path / "podbay.db")
    await lite.close()
    url = postgres_cluster.create_database()
    pg = PostgresStore.open(url)
    await pg.close()
    lite_schema = _columns("sqlite", str(tmp_path / "podbay.db"))
    assert lite_schema == _columns("postgres", url)
    assert {"deployments", "sandboxes", "meta"} <= set(lite_schema)


async def test_postgres_migrations_recorded_and_idempotent(postgres_cluster):
    url = postgres_cluster.create_database()
    latest = migrations()[-1][0]
    with psycopg.connect(url, autocommit=True) as conn:
        assert postgres.migrate(conn) == latest
        assert postgres.migrate(conn) == latest
        (recorded,) = conn.execute("SELECT version FROM podbay_schema_version").fetchall()
        assert recorded == (latest,)


def test_servers_starting_together_migrate_once(postgres_cluster):
    """Replicas starting at once on an empty database: all come up, one schema."""
    url = postgres_cluster.create_database()
    with ThreadPoolExecutor(max_workers=4) as pool:
        stores = list(pool.map(lambda _: PostgresStore.open(url), range(4)))
    for s in stores:
        asyncio.run(s.close())
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT count(*) FROM podbay_schema_version").fetchone() == (1,)


def test_dialect_keeps_unix_seconds_exact():
    assert "DOUBLE PRECISION" in dialect(migrations()[0][1])
    assert " REAL" not in dialect(migrations()[0][1])


async def test_sub_second_timestamps_survive(store):
    """Unix seconds with microseconds come back exactly (no 4-byte float anywhere)."""
    when = T0 + timedelta(microseconds=123456)
    await store.insert_sandbox(
        replace(_sb("a"), created_at=when, last_active_at=when), deployment_cap=9, account_cap=9
    )
    row = await store.get_sandbox("dep_d", "a")
    assert row.created_at == when
    assert row.last_active_at == when


async def _until_a_transaction_waits_for_a_lock(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as watcher:
        while True:
            (waiting,) = watcher.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                " AND datname = current_database()"
            ).fetchone()
            if waiting:
                return
            await asyncio.sleep(0.02)


async def test_a_transaction_aborted_by_a_deadlock_runs_again(postgres_cluster):
    """Another server locks rows in the other order: PostgreSQL aborts our side
    of the deadlock, and the store runs its transaction again instead of failing."""
    url = postgres_cluster.create_database()
    store = PostgresStore.open(url)
    try:
        for name in ("a", "b"):
            await store.insert_sandbox(_sb(name), deployment_cap=9, account_cap=9)
        a, b = "sb-dep_d-a", "sb-dep_d-b"
        with psycopg.connect(url) as other:
            # The other side waits long before checking for deadlocks, so ours is
            # the side PostgreSQL aborts.
            other.execute("SET deadlock_timeout = '30s'")
            other.execute("UPDATE sandboxes SET name = name WHERE id = %s", (b,))
            ours = asyncio.ensure_future(
                store.record_activity({a: T0 + timedelta(seconds=7), b: T0 + timedelta(seconds=7)})
            )
            await _until_a_transaction_waits_for_a_lock(url)  # ours holds a, waits for b
            await asyncio.to_thread(
                other.execute, "UPDATE sandboxes SET name = name WHERE id = %s", (a,)
            )
            other.commit()
            await ours
        for name in ("a", "b"):
            row = await store.get_sandbox("dep_d", name)
            assert row.last_active_at == T0 + timedelta(seconds=7)
    finally:
        await store.close()


async def test_a_transaction_in_flight_when_the_database_shuts_down_runs_again(postgres_cluster):
    """PostgreSQL's fast shutdown cuts a session mid-transaction (AdminShutdown):
    nothing of it was committed, so it runs again on a fresh connection once
    the server is back, and the caller (an attach) sees no error."""
    store = PostgresStore.open(postgres_cluster.create_database())
    in_flight = threading.Event()
    runs: list[int] = []

    def attachish(conn: postgres.Conn) -> int:
        runs.append(len(runs))
        conn.execute("INSERT INTO meta (key, value) VALUES ('k', 'v')")
        if len(runs) == 1:
            in_flight.set()
            conn.execute("SELECT pg_sleep(120)")  # cut by the shutdown
        return int(conn.execute("SELECT count(*) FROM meta WHERE key='k'").fetchone()[0])

    try:
        call = asyncio.create_task(store._tx(attachish))
        assert await asyncio.to_thread(in_flight.wait, 60)
        await asyncio.to_thread(postgres_cluster.restart)
        assert await call == 1
        assert runs == [0, 1]
        assert await store.get_meta("k") == "v"
    finally:
        await store.close()


async def test_a_store_that_stays_away_is_a_503_with_retry_after(postgres_cluster):
    """Every run's connection dies under it: the request is refused as
    temporary (503 STORE_UNAVAILABLE, Retry-After), never a 500 with
    psycopg's traceback."""
    store = PostgresStore.open(postgres_cluster.create_database())

    def cut(conn: postgres.Conn) -> None:
        conn.execute("SELECT pg_terminate_backend(pg_backend_pid())")

    try:
        with pytest.raises(ApiError) as refused:
            await store._tx(cut)
        assert refused.value.code is ErrorCode.STORE_UNAVAILABLE
        assert refused.value.code.status == 503
        assert refused.value.retry_after == 2
        assert "AdminShutdown" in str(refused.value)
        assert await store.get_meta("k") is None  # and the store serves on
    finally:
        await store.close()


async def test_calls_after_the_database_restarts_succeed(postgres_cluster):
    """Pooled connections die with the server; the next calls get fresh ones."""
    url = postgres_cluster.create_database()
    store = PostgresStore.open(url)
    try:
        await store.set_meta("k", "before")
        # Every pooled connection was used, so every one is cut by the restart.
        await asyncio.gather(*(store.get_meta("k") for _ in range(8)))
        postgres_cluster.restart()
        assert await asyncio.gather(*(store.get_meta("k") for _ in range(8))) == ["before"] * 8
        await store.set_meta("k", "after")
        assert await store.get_meta("k") == "after"
    finally:
        await store.close()
