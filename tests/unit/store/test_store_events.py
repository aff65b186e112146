"""Lifecycle events in the store (docs/observability.md), on both stores."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from podbay.domain import Deployment, SandboxState
from podbay.store.base import InsertOutcome
from podbay.store.observe import MAX_EVENTS
from podbay.testing.records import sandbox_record
from podbay.wire.observe import SandboxEvent

pytestmark = pytest.mark.anyio
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _event(i: int, kind: str = "ready") -> SandboxEvent:
    return SandboxEvent(at=T0 + timedelta(seconds=i), kind=kind, reason=f"step {i}")  # type: ignore[arg-type]


async def test_events_are_kept_per_name_newest_bounded_and_filtered_by_since(store):
    for i in range(MAX_EVENTS + 5):
        await store.add_event("dep_a", "box", "sbx_1", _event(i))
    await store.add_event("dep_a", "other", "sbx_2", _event(0, "created"))
    await store.add_event("dep_b", "box", "sbx_3", _event(0, "removed"))
    kept = await store.list_events("dep_a", "box")
    assert len(kept) == MAX_EVENTS
    assert kept[0].reason == "step 5"
    assert kept[-1].reason == f"step {MAX_EVENTS + 4}"
    after = await store.list_events("dep_a", "box", T0 + timedelta(seconds=MAX_EVENTS + 2))
    assert [e.reason for e in after] == [f"step {MAX_EVENTS + 3}", f"step {MAX_EVENTS + 4}"]
    assert [e.kind for e in await store.list_events("dep_b", "box")] == ["removed"]


async def test_a_removed_deployment_takes_its_events(store):
    dep = Deployment(
        id="dep_gone",
        name="gone",
        account="acct",
        spec_text="name: gone\n",
        sandbox_section=None,
        created_at=T0,
        updated_at=T0,
    )
    await store.add_deployment(dep)
    await store.add_event(dep.id, "box", "sbx_1", _event(0, "created"))
    assert await store.remove_deployment(dep.id)
    assert await store.list_events(dep.id, "box") == []


async def test_a_transition_and_its_event_commit_together_or_not_at_all(store):
    row = sandbox_record("box", at=T0)
    exists = sandbox_record("box", at=T0 + timedelta(seconds=1))
    created = _event(0, "created")
    assert await store.insert_sandbox(row, deployment_cap=9, account_cap=9, event=created) is (
        InsertOutcome.INSERTED
    )
    # The name is taken: no second row, and no event for it.
    outcome = await store.insert_sandbox(
        exists, deployment_cap=9, account_cap=9, event=_event(1, "created")
    )
    assert outcome is InsertOutcome.EXISTS
    stored = await store.get_sandbox(row.deployment_id, "box")
    ready = _event(2, "ready")
    running = await store.replace_sandbox(stored, stored.started(T0, timedelta(hours=1)), ready)
    assert running is not None
    # A writer holding the old version loses, and its event is not written.
    lost = await store.replace_sandbox(stored, stored.moved(SandboxState.DELETING), _event(3))
    assert lost is None
    kept = await store.list_events(row.deployment_id, "box")
    assert [(e.kind, e.reason) for e in kept] == [("created", "step 0"), ("ready", "step 2")]
