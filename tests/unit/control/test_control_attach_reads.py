"""Attach reads a sandbox's row once when nothing can have changed it since:
the unlocked read that looks for a running sandbox serves the locked path too
(NameLocks.stamp / unchanged_since), and is read again whenever a lock was
taken in between."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest

from podbay.control.services.locks import NameLocks
from podbay.domain import Sandbox

pytestmark = pytest.mark.anyio


def count_reads(harness, during_first: Callable[[], Awaitable[object]] | None = None) -> list[str]:
    """Count the store's sandbox-row reads; ``during_first`` runs after the
    first read has been made and before its row is handed back."""
    reads: list[str] = []
    real = harness.store.get_sandbox

    async def get_sandbox(deployment_id: str, name: str) -> Sandbox | None:
        row = await real(deployment_id, name)
        reads.append(name)
        if during_first is not None and len(reads) == 1:
            await during_first()
        return row

    harness.store.get_sandbox = get_sandbox
    return reads


async def test_a_resume_reads_the_row_once(harness):
    token = await harness.deployment()
    assert (await harness.attach(token, "one")).status_code == 200
    stop = await harness.call("POST", "/api/v1/sandboxes/one/stop", token)
    assert stop.status_code == 204
    reads = count_reads(harness)
    resumed = await harness.attach(token, "one")
    assert resumed.json()["start"] == "resumed"
    assert reads == ["one"]


async def test_a_create_reads_the_row_once(harness):
    token = await harness.deployment()
    reads = count_reads(harness)
    assert (await harness.attach(token, "new")).json()["start"] == "created"
    assert reads == ["new"]


async def test_a_transition_between_the_read_and_the_lock_is_read_again(harness):
    """Deleted while attach's unlocked read was on its way: the locked path reads
    the row again and creates a new sandbox, rather than resuming the destroyed
    machine the first read named."""
    token = await harness.deployment()
    assert (await harness.attach(token, "one")).status_code == 200
    await harness.call("POST", "/api/v1/sandboxes/one/stop", token)
    deployment = await harness.platform.deployments.authenticate(token)

    async def delete() -> None:
        await harness.platform.sandboxes.delete(deployment, "one")

    reads = count_reads(harness, during_first=delete)
    again = await harness.attach(token, "one")
    assert again.status_code == 200, again.text
    assert again.json()["start"] == "created"
    assert reads[:2] == ["one", "one"]


async def test_a_stamp_holds_only_while_no_lock_was_taken():
    locks = NameLocks()
    stamp = locks.stamp("d", "a")
    async with locks.hold("d", "a"):
        assert locks.unchanged_since(stamp)
        assert locks.stamp("d", "a") is None  # held: nothing read now is stable
    stamp = locks.stamp("d", "a")
    async with locks.hold("d", "b"):
        pass
    async with locks.hold("d", "a"):
        assert not locks.unchanged_since(stamp)
    async with locks.hold("d", "a"):
        assert not locks.unchanged_since(None)
