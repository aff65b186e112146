"""Routes on the nodes as the control plane keeps them: a deleted
deployment's withdrawn on each node that holds one of its sandboxes (the
cluster's side of services/deletions.py), and a withdrawal's route mark."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

import pytest

from podbay.control.services.deletions import withdraw_deleted
from podbay.control.services.transitions import Transitions
from podbay.dataplane.metrics import Metrics
from podbay.domain import Deployment, Sandbox, SandboxState
from podbay.errors import ApiError
from podbay.store.sqlite import SqliteStore
from podbay.testing.records import EPOCH, sandbox_record
from podbay.wire.codes import ErrorCode

pytestmark = pytest.mark.anyio


@dataclass
class Host:
    name: str
    answers: bool = True
    withdrawn: list[str] = field(default_factory=list)
    #: A remote node's routes are marked on their rows (routed_on).
    marks_routes: bool = True

    async def withdraw(self, sandbox_id: str) -> None:
        if not self.answers:
            raise ApiError(ErrorCode.INTERNAL, f"node {self.name} did not answer")
        self.withdrawn.append(sandbox_id)


class Hosts:
    """The part of :class:`~podbay.control.nodes.Nodes` a withdrawal uses."""

    def __init__(self, *hosts: Host) -> None:
        self.hosts = {h.name: h for h in hosts}

    async def refresh(self) -> None:
        return None

    def all(self) -> list[Host]:
        return list(self.hosts.values())

    def of(self, sandbox: Sandbox) -> Host:
        return self.hosts[sandbox.node]


def _deployment(name: str) -> Deployment:
    return Deployment(
        id=f"dep_{name}",
        name=name,
        account="acct",
        spec_text="",
        sandbox_section={},
        created_at=EPOCH,
        updated_at=EPOCH,
    )


async def test_each_node_withdraws_the_deleted_deployments_routes(tmp_path):
    store = SqliteStore.open(tmp_path / "podbay.db")
    a, b, quiet = Host("a"), Host("b"), Host("quiet", answers=False)
    try:
        for d in ("doomed", "kept"):
            await store.add_deployment(_deployment(d))
        rows = [
            ("doomed", "s1", "a"),
            ("doomed", "s2", "b"),
            ("doomed", "s3", "quiet"),
            ("doomed", "s4", "local"),  # serve's: its gateway watches the marker
            ("kept", "s1", "a"),
        ]
        for dep, name, node in rows:
            row = sandbox_record(
                name, deployment=f"dep_{dep}", state=SandboxState.RUNNING, node=node
            )
            await store.insert_sandbox(row, deployment_cap=9, account_cap=9)
        await store.remove_deployment("dep_doomed")
        missed = await withdraw_deleted(store, Hosts(a, b, quiet), "dep_doomed")  # type: ignore[arg-type]
        assert missed == ["quiet"]
        assert a.withdrawn == ["sb-dep_doomed-s1"]
        assert b.withdrawn == ["sb-dep_doomed-s2"]
    finally:
        await store.close()


class Freezing(Host):
    """A node that dies (raises) after withdrawing, before it suspends."""

    def can_suspend(self, class_: str) -> bool:
        return True

    async def suspend(self, class_: str, machine_id: str) -> None:
        raise RuntimeError("node died mid-suspend")


def _transitions(store: SqliteStore, node: Host) -> Transitions:
    return Transitions(
        store,
        Hosts(node),  # type: ignore[arg-type]
        Metrics(),
        lambda: EPOCH,
        timedelta(hours=1),
    )


async def test_a_withdrawal_forgets_a_route_mark_written_since_the_row_was_read(tmp_path):
    """Leaving running clears the row's routed_on before the route goes, even
    when the caller's copy of the row predates the mark: a transition cut off
    between the two must leave a row that attach publishes again."""
    store = SqliteStore.open(tmp_path / "podbay.db")
    node = Freezing("a")
    try:
        row = sandbox_record("s", state=SandboxState.RUNNING, node="a")
        await store.insert_sandbox(row, deployment_cap=9, account_cap=9)
        stale = await store.get_sandbox(row.deployment_id, "s")
        assert stale is not None
        assert await store.mark_routed(stale, "boot-1")
        transitions = _transitions(store, node)
        with pytest.raises(RuntimeError):
            await transitions.suspend(stale, "idle")
        assert node.withdrawn == [row.id]
        again = await store.get_sandbox(row.deployment_id, "s")
        assert again is not None
        assert again.state is SandboxState.RUNNING
        assert again.routed_on is None
    finally:
        await store.close()


class Counting(SqliteStore):
    """The store, counting the route-mark clears it is asked for."""

    clears = 0

    async def clear_routed(self, sandbox_id: str) -> None:
        self.clears += 1
        await super().clear_routed(sandbox_id)


@pytest.mark.parametrize("remote", [True, False])
async def test_a_withdrawal_clears_a_route_mark_only_where_the_node_marks_them(tmp_path, remote):
    """An in-process node (serve's) never marks a row, so its suspend spends no
    store write on clearing one; a remote node's withdrawal clears it."""
    store = Counting.open(tmp_path / "podbay.db")
    node = Freezing("a", marks_routes=remote)
    try:
        row = sandbox_record("s", state=SandboxState.RUNNING, node="a")
        await store.insert_sandbox(row, deployment_cap=9, account_cap=9)
        transitions = _transitions(store, node)
        with pytest.raises(RuntimeError):
            await transitions.suspend(row, "idle")
        assert node.withdrawn == [row.id]
        assert store.clears == (1 if remote else 0)
    finally:
        await store.close()
