"""OOM kills as events: a node counts them per sandbox (running totals, see
:meth:`podbay.node.observe.Sampler.oom_kills`), the control plane turns what is
new since its last look into ``oom_killed`` events (docs/observability.md)."""

from __future__ import annotations

from datetime import datetime


class OomTally:
    """New OOM kills since the last look, from a node's running totals (per
    sandbox id: when last seen, how many): what becomes ``oom_killed`` events."""

    def __init__(self) -> None:
        self._reported: dict[str, int] = {}

    def new(self, totals: dict[str, tuple[datetime, int]]) -> dict[str, tuple[datetime, int]]:
        fresh: dict[str, tuple[datetime, int]] = {}
        for sandbox_id, (at, count) in totals.items():
            before = self._reported.get(sandbox_id, 0)
            if count > before:
                fresh[sandbox_id] = (at, count - before)
            self._reported[sandbox_id] = count
        for gone in set(self._reported) - set(totals):
            del self._reported[gone]
        return fresh
