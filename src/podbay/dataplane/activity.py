"""Activity for the idle timer, kept in memory and flushed in batches.

Every data-plane request marks its sandbox when it starts and when it ends;
the lifecycle pass drains the marks into the store (one write per pass,
never one per request). A sandbox with a request in flight (a long ``exec``,
a big download) is busy, never idle, however long ago the request began.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import UTC, datetime


def _now() -> datetime:
    return datetime.now(UTC)


def keep_newest(marks: dict[str, datetime], seen: Mapping[str, datetime]) -> None:
    """Merge ``seen`` into ``marks``: a sandbox's later time wins."""
    for sandbox_id, when in seen.items():
        if sandbox_id not in marks or marks[sandbox_id] < when:
            marks[sandbox_id] = when


class ActivityTracker:
    def __init__(self, clock: Callable[[], datetime] = _now) -> None:
        self._seen: dict[str, datetime] = {}
        self._in_flight: dict[str, int] = {}
        self._clock = clock

    def touch(self, sandbox_id: str) -> None:
        self._seen[sandbox_id] = self._clock()

    def begin(self, sandbox_id: str) -> None:
        self._in_flight[sandbox_id] = self._in_flight.get(sandbox_id, 0) + 1
        self.touch(sandbox_id)

    def end(self, sandbox_id: str) -> None:
        left = self._in_flight.get(sandbox_id, 0) - 1
        if left > 0:
            self._in_flight[sandbox_id] = left
        else:
            self._in_flight.pop(sandbox_id, None)
        self.touch(sandbox_id)

    def busy(self, sandbox_id: str) -> bool:
        return sandbox_id in self._in_flight

    def busy_ids(self) -> list[str]:
        """Every sandbox with a request in flight."""
        return list(self._in_flight)

    def last(self, sandbox_id: str) -> datetime | None:
        return self._seen.get(sandbox_id)

    def drain(self) -> dict[str, datetime]:
        seen, self._seen = self._seen, {}
        return seen

    def restore(self, seen: dict[str, datetime]) -> None:
        """Put back marks a failed flush took, keeping any newer ones."""
        keep_newest(self._seen, seen)
