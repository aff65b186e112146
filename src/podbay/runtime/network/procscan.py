"""What ``/proc`` says about a process: one parser for ``stat``, one for ``cmdline``.

A pid alone can be reused; a pid with its start time (``stat`` field 22, in
clock ticks since boot) names one process for good, so records keep both.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ProcStat", "alive", "cmdline", "find", "start_time", "stat"]


@dataclass(frozen=True)
class ProcStat:
    #: One letter: R, S, D, Z (zombie), T, ...
    state: str
    #: Field 22 as text, as runc and our pid files record it.
    start_time: str


def stat(pid: int) -> ProcStat | None:
    """``/proc/<pid>/stat``, or ``None`` when there is no such process."""
    if pid <= 0:
        return None
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after the last ")".
    fields = text[text.rindex(")") + 2 :].split()
    return ProcStat(state=fields[0], start_time=fields[19])


def start_time(pid: int) -> str | None:
    found = stat(pid)
    return found.start_time if found else None


def alive(pid: int, start: object = None) -> bool:
    """``pid`` runs (not a zombie) and, when ``start`` is given, is still that process."""
    found = stat(pid)
    if found is None or found.state == "Z":
        return False
    return start is None or found.start_time == str(start)


def cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def find(matches: Callable[[int], bool]) -> list[int]:
    """Every pid for which ``matches(pid)`` holds."""
    return [int(e.name) for e in os.scandir("/proc") if e.name.isdigit() and matches(int(e.name))]
