"""The client's result types: typed, frozen dataclasses with Pythonic names.

Where the wire model already is the result a caller wants (``ExecResult``,
``ProcessStatus``, ``ProcessOutput``, ``SandboxRecord``, ``SandboxHandle``)
it is re-exported, not copied: the contract stays the one source of truth.
The rest exist only on the client side.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from podbay.wire.control import (
    BuildStep,
    EgressAudit,
    EgressDestination,
    ForkResult,
    NetworkPolicy,
    Preparing,
    SandboxHandle,
    SandboxRecord,
    Volume,
    VolumeEntry,
    VolumeMount,
)
from podbay.wire.data import ExecEvent, ExecResult, FileInfo, ProcessOutput, ProcessStatus
from podbay.wire.observe import (
    CommandEntry,
    CommandList,
    EventList,
    Metrics,
    MetricSample,
    SandboxEvent,
)


# Every model below is a frozen keyword-only dataclass of a few fields, one per
# message: alike in shape to each other (and to the other model modules) on
# purpose, since each declares its own message of the contract.
@dataclass(frozen=True, kw_only=True)
class CombinedResult:
    """:meth:`~podbay.SandboxClient.exec_combined`: stderr folded into stdout.

    ``timed_out`` is an addition to the reference's three fields.
    """

    output: str
    exit_code: int
    truncated: bool
    timed_out: bool = False


@dataclass(frozen=True, kw_only=True)
class RunResult(ProcessOutput):
    """:meth:`~podbay.SandboxClient.run`: a :class:`ProcessOutput` plus how it ended.

    ``stdout``/``stderr`` hold the WHOLE output the client received (not
    only the last poll's); ``stdout_dropped``/``stderr_dropped`` are the
    totals lost to the agent's 1 MiB retention.
    """

    timed_out: bool = False  # ``timeout_ms`` elapsed
    killed: bool = False  # stopped by ``timeout_ms`` or ``cancel`` rather than exiting


@dataclass(frozen=True, kw_only=True)
class DirEntry:
    """One entry of :meth:`~podbay.SandboxClient.list_dir`."""

    name: str
    is_directory: bool


@dataclass(frozen=True, kw_only=True)
class GrepMatch:
    """One matching line of :meth:`~podbay.SandboxClient.grep` (``line`` is 1-based)."""

    path: str
    line: int
    text: str


class Progress(Protocol):
    """A transfer progress callback: ``(bytes_done, bytes_total)``; total is
    ``None`` when unknown."""

    def __call__(self, done: int, total: int | None, /) -> None: ...


class Cancel(Protocol):
    """Anything with ``is_set()``: ``threading.Event``, ``asyncio.Event``,
    ``anyio.Event``. :meth:`~podbay.SandboxClient.run` checks it every poll."""

    def is_set(self) -> bool: ...


__all__ = [
    "BuildStep",
    "BytesResult",
    "Cancel",
    "CombinedResult",
    "CommandEntry",
    "CommandList",
    "DirEntry",
    "EgressAudit",
    "EgressDestination",
    "EventList",
    "ExecEvent",
    "ExecResult",
    "FileInfo",
    "ForkResult",
    "GrepMatch",
    "MetricSample",
    "Metrics",
    "NetworkPolicy",
    "Preparing",
    "ProcessOutput",
    "ProcessStatus",
    "Progress",
    "RunResult",
    "SandboxEvent",
    "SandboxHandle",
    "SandboxRecord",
    "Volume",
    "VolumeEntry",
    "VolumeMount",
]


@dataclass(frozen=True, kw_only=True)
class BytesResult:
    """:meth:`~podbay.SandboxClient.exec_bytes`: the output as raw bytes.

    ``stdout_dropped``/``stderr_dropped``: bytes of each stream not kept
    (see ``keep``); ``truncated`` when any were dropped.
    """

    exit_code: int
    stdout: bytes
    stderr: bytes
    duration_ms: int
    timed_out: bool
    truncated: bool
    stdout_dropped: int = 0
    stderr_dropped: int = 0

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out
