"""The agent's command log: bounded, never output, completes as children exit."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

from podbay.agent.commands import CommandLog
from podbay.wire.observe import MAX_ARG


def child(code: int | None = None, ended: float | None = None) -> Any:
    return SimpleNamespace(code=code, exited_mono=ended)


def test_entries_complete_when_their_child_exits_and_stay_bounded() -> None:
    log = CommandLog(size=2)
    started = time.monotonic()
    running = child()
    log.add("spawn", ["sleep", "9"], "root", running, started)
    log.add("exec", ["x" * (MAX_ARG + 5)], "nobody", child(3, started + 0.25), started)
    first, second = log.listing().commands
    assert (first.kind, first.exit_code, first.duration_ms) == ("spawn", None, None)
    assert (second.user, second.exit_code, second.duration_ms) == ("nobody", 3, 250)
    assert len(second.argv[0]) == MAX_ARG + 1  # cut, with the mark
    running.code, running.exited_mono = 0, started + 1.0
    assert log.listing().commands[0].exit_code == 0
    log.add("exec", ["true"], "root", child(0, started), started)
    assert [c.argv[0] for c in log.listing().commands][-1] == "true"
    assert len(log.listing().commands) == 2  # the oldest went
