"""A suspended sandbox is reclaimed an hour (``suspended_ttl``) after its
suspension, not an hour after its last activity.

Before: with the defaults (15 min idle, 1 h ttl) a sandbox was removed after
45 minutes suspended. The platform runs in process over the fake driver
with a hand-moved clock, so the thresholds are exact.
"""

from __future__ import annotations

import asyncio
import sqlite3
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[1] / "unit" / "control"))
from platform_harness import Harness, build_harness, make_settings

from podbay.store.sql import migrations
from podbay.store.sqlite import SqliteStore

pytestmark = [pytest.mark.anyio, pytest.mark.timeout(60)]
IDLE, TTL = 15 * 60, 60 * 60  # the product's defaults


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def life(tmp_path: Path) -> AsyncIterator[Harness]:
    async with build_harness(
        tmp_path, make_settings(tmp_path, idle=IDLE, ttl=TTL, max_age=24 * 3600)
    ) as h:
        yield h


async def state(h: Harness, token: str, name: str) -> object:
    r = await h.call("GET", f"/api/v1/sandboxes/{name}", token)
    return r.json()["state"] if r.status_code == 200 else r.status_code


async def test_the_hour_counts_from_the_suspension(life: Harness) -> None:
    token = await life.deployment()
    assert (await life.attach(token, "s")).status_code == 200
    life.clock.advance(IDLE + 1)
    await life.platform.lifecycle.run_pass()
    assert await state(life, token, "s") == "suspended"
    # 45 minutes suspended (an hour since the last activity): still there.
    life.clock.advance(TTL - IDLE)
    await life.platform.lifecycle.run_pass()
    assert await state(life, token, "s") == "suspended"
    # An hour suspended: reclaimed.
    life.clock.advance(IDLE)
    await life.platform.lifecycle.run_pass()
    assert await state(life, token, "s") == 404


async def test_stop_keeps_the_clock_and_resume_resets_it(life: Harness) -> None:
    token = await life.deployment()
    await life.attach(token, "s")
    assert (await life.call("POST", "/api/v1/sandboxes/s/stop", token)).status_code == 204
    life.clock.advance(TTL - 10)
    assert (await life.attach(token, "s")).json()["start"] == "resumed"
    assert (await life.call("POST", "/api/v1/sandboxes/s/stop", token)).status_code == 204
    life.clock.advance(TTL - 10)  # under an hour since this suspension
    await life.platform.lifecycle.run_pass()
    assert await state(life, token, "s") == "suspended"
    life.clock.advance(20)
    await life.platform.lifecycle.run_pass()
    assert await state(life, token, "s") == 404


def test_store_migration_gives_old_suspended_rows_a_suspension_time(tmp_path: Path) -> None:
    db = tmp_path / "podbay.db"
    conn = sqlite3.connect(db)
    version, first = migrations()[0]
    conn.executescript(first)
    conn.execute(f"PRAGMA user_version = {version}")
    for state_, sid in (("suspended", "sb-1"), ("running", "sb-2")):
        conn.execute(
            "INSERT INTO sandboxes (id, deployment_id, account, name, class, state, machine_id,"
            " created_at, last_active_at) VALUES (?, 'd', 'a', ?, 'default', ?, ?, 100, 200)",
            (sid, sid, state_, "m-" + sid),
        )
    conn.commit()
    conn.close()
    store = SqliteStore.open(db)

    async def rows() -> dict[str, object]:
        try:
            return {s.id: s.suspended_at for s in await store.list_sandboxes()}
        finally:
            await store.close()

    got = asyncio.run(rows())
    assert got["sb-2"] is None
    assert got["sb-1"] is not None
    assert got["sb-1"].timestamp() == 200
