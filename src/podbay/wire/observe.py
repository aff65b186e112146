"""Per-sandbox observability on the control plane (docs/observability.md):
metrics samples, lifecycle events and the command log."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal


def on_the_wire(moment: datetime) -> datetime:
    """``moment`` as the wire shows it (milliseconds), so that a ``since``
    copied from an answer excludes the item it was copied from."""
    return moment.replace(microsecond=moment.microsecond // 1000 * 1000)


#: Command log entries kept per sandbox: the newest.
MAX_COMMANDS = 500
#: Of each logged argv: this many arguments, each cut to MAX_ARG characters.
MAX_ARGS = 64
MAX_ARG = 1024
CUT = "…"


def bounded_argv(argv: list[str]) -> list[str]:
    """``argv`` cut to the command log's bounds (a command line may be megabytes).

    >>> bounded_argv(["a" * 2000])[0][-3:], len(bounded_argv(["x"] * 100))
    ('aa…', 65)
    """
    kept = [a if len(a) <= MAX_ARG else a[:MAX_ARG] + CUT for a in argv[:MAX_ARGS]]
    return [*kept, CUT] if len(argv) > MAX_ARGS else kept


#: How often a node samples each running sandbox.
METRICS_INTERVAL_SECONDS = 2.0

#: What happened to a sandbox (``policy_changed``: its egress policy was
#: changed through ``PUT .../network``, in force from then on; ``forked``: it
#: was copied into new sandboxes, ``POST .../fork``).
EventKind = Literal[
    "created",
    "ready",
    "suspended",
    "resumed",
    "stopped",
    "carried_over",
    "moved",
    "removed",
    "policy_changed",
    "oom_killed",
    "forked",
]


@dataclass(frozen=True, kw_only=True)
class MetricSample:
    """One reading. ``cpu_percent`` is of one core over the period before
    ``at`` (200 = two cores busy); the rest are levels at ``at`` except the
    network bytes, counted since the machine started."""

    at: datetime
    cpu_percent: float
    memory_bytes: int
    memory_limit_bytes: int
    disk_bytes: int
    net_rx_bytes: int
    net_tx_bytes: int


@dataclass(frozen=True, kw_only=True)
class Metrics:
    """``GET /api/v1/sandboxes/{name}/metrics``: oldest first."""

    interval_seconds: float
    samples: list[MetricSample] = field(default_factory=list)


@dataclass(frozen=True, kw_only=True)
class SandboxEvent:
    """One transition of a sandbox, when and why."""

    at: datetime
    kind: EventKind
    reason: str = ""


@dataclass(frozen=True, kw_only=True)
class EventList:
    """``GET /api/v1/sandboxes/{name}/events``: oldest first."""

    events: list[SandboxEvent] = field(default_factory=list)


@dataclass(frozen=True, kw_only=True)
class CommandEntry:
    """One exec or spawn: never its input or output. ``exit_code`` and
    ``duration_ms`` are absent while a spawned process runs."""

    at: datetime
    argv: list[str]
    user: str
    kind: Literal["exec", "spawn"]
    exit_code: int | None = None
    duration_ms: int | None = None


@dataclass(frozen=True, kw_only=True)
class CommandList:
    """``GET /api/v1/sandboxes/{name}/commands``: oldest first. ``enabled``
    is false when the operator turned the deployment's command log off."""

    commands: list[CommandEntry] = field(default_factory=list)
    enabled: bool = True


def net_dev_bytes(text: str) -> tuple[int, int]:
    """Bytes received and sent over every interface but loopback, from the
    text of a ``/proc/<pid>/net/dev``."""
    rx = tx = 0
    for line in text.splitlines()[2:]:
        name, _, counters = line.partition(":")
        fields = counters.split()
        if name.strip() == "lo" or len(fields) < 9:
            continue
        rx += int(fields[0])
        tx += int(fields[8])
    return rx, tx
