"""The sandbox's command log: each exec and spawn's argv, user, exit code and
duration, never its input or output (docs/observability.md).

Kept in the agent's memory, the newest
:data:`~podbay.wire.observe.MAX_COMMANDS`, and read by the host at ``GET
/v1/commands``; an entry holds its command's child, whose exit code and end
the reaper fills in, so a spawned process's entry completes without another
hook. Each argv is cut to a bounded size: a command line may
be megabytes, and the log must stay small. It covers the machine's current
boot (a stopped machine's agent starts a new one).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

from podbay.wire.observe import MAX_COMMANDS, CommandEntry, CommandList, bounded_argv

from .launch import Child


@dataclass(frozen=True)
class _Entry:
    """One command as started; its end is read from ``child`` when listed."""

    at: datetime
    argv: list[str]
    user: str
    kind: Literal["exec", "spawn"]
    child: Child
    started: float

    def render(self) -> CommandEntry:
        code, ended = self.child.code, self.child.exited_mono
        done = code is not None and ended is not None
        return CommandEntry(
            at=self.at,
            argv=self.argv,
            user=self.user,
            kind=self.kind,
            exit_code=code if done else None,
            duration_ms=int((ended - self.started) * 1000) if done and ended else None,
        )


class CommandLog:
    def __init__(self, size: int = MAX_COMMANDS) -> None:
        self._entries: deque[_Entry] = deque(maxlen=size)
        self._lock = threading.Lock()

    def add(
        self,
        kind: Literal["exec", "spawn"],
        argv: list[str],
        user: str,
        child: Child,
        started: float | None = None,
    ) -> None:
        entry = _Entry(
            at=datetime.now(UTC),
            argv=bounded_argv(argv),
            user=user,
            kind=kind,
            child=child,
            started=time.monotonic() if started is None else started,
        )
        with self._lock:
            self._entries.append(entry)

    def listing(self) -> CommandList:
        with self._lock:
            entries = list(self._entries)
        return CommandList(commands=[e.render() for e in entries])
