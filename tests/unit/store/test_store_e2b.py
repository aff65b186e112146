"""The E2B queries (podbay.store.e2b) on SQLite and PostgreSQL."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import cast

import pytest

from podbay.domain import Deployment
from podbay.store.base import Store
from podbay.store.e2b import E2BSandbox, E2BStore

pytestmark = pytest.mark.anyio
NOW = datetime(2026, 12, 2, tzinfo=UTC)


def _row(sandbox_id: str, deployment_id: str, end_in: int) -> E2BSandbox:
    return E2BSandbox(
        sandbox_id=sandbox_id,
        deployment_id=deployment_id,
        template="base",
        metadata={"k": "v"},
        env_vars={"A": "1"},
        started_at=NOW,
        end_at=NOW + timedelta(seconds=end_in),
    )


async def test_keys_are_found_by_hash_until_revoked(store: object) -> None:
    rows = cast(E2BStore, store)
    await rows.add_e2b_key("h1", "dep_a", NOW)
    await rows.add_e2b_key("h2", "dep_b", NOW)
    assert await rows.e2b_key_deployment("h1") == "dep_a"
    assert await rows.revoke_e2b_keys("dep_a", NOW) == 1
    assert await rows.e2b_key_deployment("h1") is None
    assert await rows.e2b_key_deployment("h2") == "dep_b"  # another deployment's stays


async def test_sandbox_rows_by_deployment_and_end(store: object) -> None:
    rows = cast(E2BStore, store)
    await rows.add_e2b_sandbox(_row("s1", "dep_a", 10))
    await rows.add_e2b_sandbox(_row("s2", "dep_b", 100))
    assert await rows.get_e2b_sandbox("s1") == _row("s1", "dep_a", 10)
    assert [r.sandbox_id for r in await rows.list_e2b_sandboxes(deployment_id="dep_b")] == ["s2"]
    ended = await rows.list_e2b_sandboxes(ended_by=NOW + timedelta(seconds=50))
    assert [r.sandbox_id for r in ended] == ["s1"]
    assert await rows.set_e2b_end("s1", NOW + timedelta(seconds=500))
    assert await rows.list_e2b_sandboxes(ended_by=NOW + timedelta(seconds=50)) == []
    await rows.delete_e2b_sandbox("s1")
    assert await rows.get_e2b_sandbox("s1") is None
    assert not await rows.set_e2b_end("s1", NOW)


async def test_a_paused_sandbox_is_past_no_timeout_until_it_runs_again(store: object) -> None:
    rows = cast(E2BStore, store)
    await rows.add_e2b_sandbox(replace(_row("s1", "dep_a", 10), on_timeout="pause"))
    assert (await rows.get_e2b_sandbox("s1")) == replace(
        _row("s1", "dep_a", 10), on_timeout="pause"
    )
    later = NOW + timedelta(seconds=50)
    assert [r.sandbox_id for r in await rows.list_e2b_sandboxes(ended_by=later)] == ["s1"]
    assert await rows.set_e2b_paused("s1", later)
    found = await rows.get_e2b_sandbox("s1")
    assert found is not None
    assert found.paused_at == later
    assert await rows.list_e2b_sandboxes(ended_by=later) == []  # the sweep passes it over
    assert await rows.set_e2b_paused("s1", None, later + timedelta(seconds=300))
    found = await rows.get_e2b_sandbox("s1")
    assert found is not None
    assert (found.paused_at, found.end_at) == (
        None,
        later + timedelta(seconds=300),
    )
    assert not await rows.set_e2b_paused("s2", later)


async def test_a_row_and_its_deployment_come_in_one_statement(store: Store) -> None:
    """The sandbox API's check of every call reads both in one trip."""
    rows = cast(E2BStore, store)
    dep = Deployment(
        id="dep_a",
        name="a",
        account="acct",
        spec_text="x: 1",
        sandbox_section=None,
        created_at=NOW,
        updated_at=NOW,
    )
    await store.add_deployment(dep)
    await rows.add_e2b_sandbox(_row("s1", "dep_a", 10))
    await rows.add_e2b_sandbox(_row("s2", "dep_gone", 10))
    assert await rows.get_e2b_sandbox_and_deployment("s1") == (_row("s1", "dep_a", 10), dep)
    assert await rows.get_e2b_sandbox_and_deployment("s2") is None  # its deployment is gone
    assert await rows.get_e2b_sandbox_and_deployment("nope") is None
