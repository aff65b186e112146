"""The newest metrics sample of each running sandbox, for the console's live
list (the stream's ``metrics`` event).

Each node keeps its sandboxes' samples (:mod:`podbay.node.observe`); this asks
a node for all of its newest at once, at most once per sample period however
many streams watch: a cluster's control plane makes one call per node per
period, never one per sandbox. A node that does not answer leaves its
sandboxes out of that period's event (the list shows their last figures).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING

from podbay.domain import Sandbox, SandboxState
from podbay.errors import ApiError
from podbay.wire.observe import METRICS_INTERVAL_SECONDS, MetricSample

if TYPE_CHECKING:
    from podbay.control.nodes import Node, Nodes

log = logging.getLogger("podbay.console")


class LatestSamples:
    def __init__(self, nodes: Nodes, period: float = METRICS_INTERVAL_SECONDS) -> None:
        self.nodes = nodes
        self.period = period
        #: node name → (when asked, the answer): streams that look within the
        #: same period share one call, in flight or done.
        self._asked: dict[str, tuple[float, asyncio.Task[dict[str, MetricSample]]]] = {}

    async def of(self, rows: Iterable[Sandbox]) -> dict[str, MetricSample]:
        """Sandbox name → its newest sample, for the running ones among ``rows``."""
        by_node: dict[str, tuple[Node, list[Sandbox]]] = {}
        for row in rows:
            if row.state is not SandboxState.RUNNING:
                continue
            try:
                node = self.nodes.of(row)
            except ApiError:
                continue  # its node is lost: nothing new to show
            by_node.setdefault(node.name, (node, []))[1].append(row)
        answers = await asyncio.gather(*(self._ask(node) for node, _ in by_node.values()))
        return {
            row.name: samples[row.id]
            for (_, held), samples in zip(by_node.values(), answers, strict=True)
            for row in held
            if row.id in samples
        }

    async def _ask(self, node: Node) -> dict[str, MetricSample]:
        now = time.monotonic()
        asked = self._asked.get(node.name)
        if asked is None or now - asked[0] >= self.period:
            asked = (now, asyncio.ensure_future(node.latest_metrics()))
            # Read its fault even when every stream that asked has gone.
            asked[1].add_done_callback(lambda t: t.cancelled() or t.exception())
            self._asked[node.name] = asked
        try:
            # Shielded: a stream that goes away must not cancel its neighbours' answer.
            return await asyncio.shield(asked[1])
        except (ApiError, OSError) as exc:
            log.info("node %s: no metrics for the console: %s", node.name, exc)
            return {}
