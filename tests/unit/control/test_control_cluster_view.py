"""What a control replica's view of the nodes answers about classes while the
nodes start: a passing state is a 503 to ask again, never a class refused."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from podbay.control.keys import KeyRing
from podbay.control.remote import ClusterNodes
from podbay.domain.node import NodeRecord
from podbay.errors import ApiError
from podbay.wire.codes import ErrorCode

pytestmark = pytest.mark.anyio
NOW = datetime(2026, 1, 1, tzinfo=UTC)


def _record(name: str, *, ready: bool, classes: list[str]) -> NodeRecord:
    report: dict[str, Any] = {"ready": ready, "classes": classes, "capacity": 4}
    if classes:
        report["default"] = classes[0]
    return NodeRecord(
        name=name,
        url=f"http://{name}.invalid:8700",
        drained=False,
        report=report,
        enrolled_at=NOW,
        heartbeat_at=NOW,
    )


class Nodes:
    """The store's ``nodes`` table, as the test sets it; counts the reads."""

    def __init__(self, *records: NodeRecord) -> None:
        self.records = list(records)
        self.reads = 0

    async def list_nodes(self) -> list[NodeRecord]:
        self.reads += 1
        return list(self.records)


def _cluster(store: Nodes, tmp_path: Path) -> ClusterNodes:
    return ClusterNodes(
        store,  # type: ignore[arg-type]  # only its nodes table is read
        KeyRing.open(tmp_path / "keys"),
        lost_after=30,
        clock=lambda: NOW,
    )


async def test_nodes_still_starting_make_a_class_a_503_to_ask_again(tmp_path: Path) -> None:
    # Seen as 409 "they can run: none" from a replica whose view predated the
    # nodes' first ready heartbeat.
    nodes = _cluster(Nodes(_record("a", ready=False, classes=[])), tmp_path)
    try:
        await nodes.refresh(force=True)
        for ask in (nodes.require, nodes.resolve):
            with pytest.raises(ApiError) as caught:
                ask("gvisor")
            assert caught.value.code is ErrorCode.SANDBOXES_UNAVAILABLE
            assert caught.value.status == 503
            assert caught.value.retry_after == 2
    finally:
        await nodes.close()


async def test_a_class_no_ready_node_runs_is_refused_while_others_run(tmp_path: Path) -> None:
    store = Nodes(_record("a", ready=True, classes=["container"]))
    nodes = _cluster(store, tmp_path)
    try:
        await nodes.refresh(force=True)
        assert nodes.require("container") == "container"
        with pytest.raises(ApiError) as caught:
            nodes.require("vm")
        assert caught.value.code is ErrorCode.SANDBOX_CLASS_UNAVAILABLE
        assert "they can run: container" in caught.value.message
    finally:
        await nodes.close()


async def test_a_view_in_which_nothing_runs_yet_is_read_again_at_once(tmp_path: Path) -> None:
    store = Nodes(_record("a", ready=False, classes=[]))
    nodes = _cluster(store, tmp_path)
    try:
        await nodes.refresh(force=True)
        store.records = [_record("a", ready=True, classes=["gvisor"])]  # ready since
        await nodes.refresh()  # well within STALE_SECONDS of the last read
        assert nodes.require("gvisor") == "gvisor"
        assert nodes.resolve("default") == "gvisor"
        # Once something runs, the view is kept for STALE_SECONDS as before.
        reads = store.reads
        await nodes.refresh()
        assert store.reads == reads
    finally:
        await nodes.close()
