"""Every store test runs on both stores: SQLite (a file) and PostgreSQL (a real
temporary cluster, started once per test run, one fresh database per test)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator

import pytest

from podbay.store.base import Store
from podbay.store.postgres import PostgresStore
from podbay.store.sqlite import SqliteStore
from podbay.testing.postgres import TemporaryCluster


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session")
def postgres_cluster() -> Iterator[TemporaryCluster]:
    with TemporaryCluster.start() as cluster:
        yield cluster


@pytest.fixture(params=["sqlite", "postgres"])
def store_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def store_target(store_kind, tmp_path, request) -> str:
    """Where this test's stores live: a SQLite path or a fresh database's URL."""
    if store_kind == "sqlite":
        return str(tmp_path / "podbay.db")
    cluster: TemporaryCluster = request.getfixturevalue("postgres_cluster")
    return cluster.create_database()


@pytest.fixture
async def new_store(store_kind, store_target) -> AsyncIterator[Callable[[], Store]]:
    """Opens another store on the test's one database, as another replica would."""
    opened: list[Store] = []

    def open_one() -> Store:
        from pathlib import Path

        store: Store = (
            SqliteStore.open(Path(store_target))
            if store_kind == "sqlite"
            else PostgresStore.open(store_target)
        )
        opened.append(store)
        return store

    yield open_one
    for store in opened:
        await store.close()


@pytest.fixture
async def store(new_store) -> Store:
    return new_store()
