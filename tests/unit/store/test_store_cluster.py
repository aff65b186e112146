"""Nodes, shared signing keys and leases, on both stores (split roles)."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from podbay.domain import Sandbox, SandboxState
from podbay.testing.records import sandbox_record

pytestmark = pytest.mark.anyio
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _sb(name: str, node: str) -> Sandbox:
    return sandbox_record(name, state=SandboxState.RUNNING, node=node, at=T0)


async def test_nodes_enroll_heartbeat_drain_forget(store):
    await store.enroll_node("n1", "http://n1", "hash-1", {"classes": ["container"]}, T0)
    await store.enroll_node("n2", "http://n2", "hash-2", {}, T0)
    assert (await store.node_by_credential("hash-1")).name == "n1"
    assert await store.node_by_credential("hash-x") is None
    before = await store.heartbeat_node("n1", {"running": 3}, T0 + timedelta(seconds=5))
    assert before is not None
    assert before.report == {"classes": ["container"]}
    n1, n2 = await store.list_nodes()
    assert n1.report == {"running": 3}
    assert n1.heartbeat_at == T0 + timedelta(seconds=5)
    assert n1.state(T0 + timedelta(seconds=10), 30) == "ready"
    assert n2.state(T0 + timedelta(seconds=30), 30) == "lost"
    assert await store.drain_node("n1")
    assert (await store.list_nodes())[0].state(T0, 30) == "draining"
    # Enrolling again under an enrolled name changes nothing (not its URL, not
    # its credential, not the operator's drain): a name is not taken over.
    assert not await store.enroll_node("n1", "http://n1b", "hash-3", {}, T0)
    assert await store.node_by_credential("hash-3") is None
    kept = await store.node_by_credential("hash-1")
    assert kept is not None
    assert kept.drained
    assert kept.url == "http://n1"
    assert kept.credential_hash == "hash-1"
    # Rows remember their node; forgetting a node forgets its sandboxes.
    for name, node in (("a", "n1"), ("b", "n2"), ("c", "n2")):
        await store.insert_sandbox(_sb(name, node), deployment_cap=9, account_cap=9)
    assert (await store.get_sandbox("dep_d", "b")).node == "n2"
    assert await store.held_by_node() == {"n1": 1, "n2": 2}
    assert await store.forget_node("n2")
    assert [r.name for r in await store.list_sandboxes()] == ["a"]
    assert [n.name for n in await store.list_nodes()] == ["n1"]
    assert await store.heartbeat_node("n2", {}, T0) is None


async def test_signing_keys_shared(new_store):
    first, second = new_store(), new_store()
    await first.add_signing_key("0002-b", "pem-b", T0)
    await first.add_signing_key("0001-a", "pem-a", T0)
    await second.add_signing_key("0001-a", "other", T0)  # a kid is written once
    assert await second.signing_keys() == [("0001-a", "pem-a"), ("0002-b", "pem-b")]
    assert await second.remove_signing_key("0001-a")
    assert await first.signing_keys() == [("0002-b", "pem-b")]


async def test_one_holder_per_lease_across_instances(new_store):
    first, second = new_store(), new_store()
    got = await asyncio.gather(
        *((first if i % 2 else second).take_lease("k", f"h{i}", 30, T0) for i in range(20))
    )
    assert got.count(True) == 1
    holder = f"h{got.index(True)}"
    assert await first.take_lease("k", holder, 30, T0 + timedelta(seconds=1))  # renewal
    assert not await second.take_lease("k", "other", 30, T0 + timedelta(seconds=2))
    assert await second.take_lease("k", "other", 30, T0 + timedelta(seconds=40))  # expired
    await first.drop_lease("k", holder)  # not its holder any more: nothing happens
    assert not await first.take_lease("k", holder, 30, T0 + timedelta(seconds=41))
    await second.drop_lease("k", "other")
    assert await first.take_lease("k", holder, 30, T0 + timedelta(seconds=41))


async def test_node_survives_a_sandbox_write(store):
    await store.insert_sandbox(_sb("a", "n7"), deployment_cap=9, account_cap=9)
    row = await store.get_sandbox("dep_d", "a")
    new = await store.replace_sandbox(row, replace(row.moved(SandboxState.SUSPENDED)))
    assert new is not None
    assert new.node == "n7"


async def test_a_new_boot_of_a_node_forgets_the_routes_of_the_last_one(store):
    await store.enroll_node("n1", "http://n1", "h1", {"boot": "b1"}, T0)
    for name, node in (("a", "n1"), ("b", "n1"), ("c", "n2")):
        await store.insert_sandbox(_sb(name, node), deployment_cap=9, account_cap=9)
        row = await store.get_sandbox("dep_d", name)
        assert await store.mark_routed(row, "b1" if name != "b" else "b2")

    async def marks() -> dict[str, str | None]:
        return {r.name: r.routed_on for r in await store.list_sandboxes()}

    await store.heartbeat_node("n1", {"boot": "b1"}, T0)  # same process: kept
    assert await marks() == {"a": "b1", "b": "b2", "c": "b1"}
    await store.heartbeat_node("n1", {"boot": "b2"}, T0)  # restarted
    assert await marks() == {"a": None, "b": "b2", "c": "b1"}  # another node's kept
    assert not await store.enroll_node("n1", "http://n1", "h2", {"boot": "b3"}, T0)
    assert await marks() == {"a": None, "b": "b2", "c": "b1"}  # refused: nothing changed
