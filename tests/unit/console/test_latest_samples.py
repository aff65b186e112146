"""The stream's ``metrics`` event asks each node once per sample period for
all its sandboxes' newest samples, however many sandboxes and streams."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any, cast

import pytest

from podbay.console.latest import LatestSamples
from podbay.control.nodes import Nodes
from podbay.domain import Sandbox, SandboxState
from podbay.errors import ApiError
from podbay.testing.records import sandbox_record
from podbay.wire.codes import ErrorCode
from podbay.wire.observe import MetricSample

pytestmark = pytest.mark.anyio
NOW = datetime(2026, 12, 2, 5, 0, tzinfo=UTC)


def _sample(cpu: float) -> MetricSample:
    return MetricSample(
        at=NOW,
        cpu_percent=cpu,
        memory_bytes=1,
        memory_limit_bytes=2,
        disk_bytes=3,
        net_rx_bytes=4,
        net_tx_bytes=5,
    )


class _Node:
    def __init__(self, name: str, samples: dict[str, MetricSample]) -> None:
        self.name = name
        self.samples = samples
        self.calls = 0
        self.fail = False

    async def latest_metrics(self) -> dict[str, MetricSample]:
        self.calls += 1
        await asyncio.sleep(0)  # in flight while a second stream asks
        if self.fail:
            raise ApiError(ErrorCode.SANDBOXES_UNAVAILABLE, "node a did not answer")
        return self.samples


class _Nodes:
    def __init__(self, *nodes: _Node) -> None:
        self.by_name = {n.name: n for n in nodes}

    def of(self, sandbox: Sandbox) -> Any:
        if sandbox.node == "lost":
            raise ApiError(ErrorCode.SANDBOXES_UNAVAILABLE, "node lost")
        return self.by_name[sandbox.node]


def _row(name: str, node: str, state: SandboxState = SandboxState.RUNNING) -> Sandbox:
    return sandbox_record(name, state=state, node=node, at=NOW)


async def test_one_call_per_node_per_period_for_every_sandbox_and_stream() -> None:
    rows = [_row("a1", "a"), _row("a2", "a"), _row("b1", "b"), _row("gone", "lost")]
    rows.append(_row("idle", "a", SandboxState.SUSPENDED))
    a = _Node("a", {rows[0].id: _sample(1), rows[1].id: _sample(2), rows[4].id: _sample(9)})
    b = _Node("b", {rows[2].id: _sample(3)})
    latest = LatestSamples(cast(Nodes, _Nodes(a, b)), period=3600)
    first, second = await asyncio.gather(latest.of(rows), latest.of(rows))
    assert first == second == {"a1": _sample(1), "a2": _sample(2), "b1": _sample(3)}
    assert (a.calls, b.calls) == (1, 1)
    # The next period asks again.
    latest.period = 0
    await latest.of(rows)
    assert (a.calls, b.calls) == (2, 2)


async def test_a_node_that_does_not_answer_leaves_only_its_sandboxes_out() -> None:
    rows = [_row("a1", "a"), _row("b1", "b")]
    a, b = _Node("a", {rows[0].id: _sample(1)}), _Node("b", {rows[1].id: _sample(2)})
    a.fail = True
    latest = LatestSamples(cast(Nodes, _Nodes(a, b)), period=0)
    assert await latest.of(rows) == {"b1": _sample(2)}
