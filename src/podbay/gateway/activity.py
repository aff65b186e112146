"""Activity for the idle timer, kept in memory and flushed in batches.

Every data-plane request marks its sandbox; the lifecycle pass drains the
marks into the store (one write per pass, never one per request).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime


def _now() -> datetime:
    return datetime.now(UTC)


class ActivityTracker:
    def __init__(self, clock: Callable[[], datetime] = _now) -> None:
        self._seen: dict[str, datetime] = {}
        self._clock = clock

    def touch(self, sandbox_id: str) -> None:
        self._seen[sandbox_id] = self._clock()

    def last(self, sandbox_id: str) -> datetime | None:
        return self._seen.get(sandbox_id)

    def drain(self) -> dict[str, datetime]:
        seen, self._seen = self._seen, {}
        return seen

    def restore(self, seen: dict[str, datetime]) -> None:
        """Put back marks a failed flush took, keeping any newer ones."""
        for sandbox_id, when in seen.items():
            if sandbox_id not in self._seen or self._seen[sandbox_id] < when:
                self._seen[sandbox_id] = when
