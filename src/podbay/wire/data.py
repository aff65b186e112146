"""Data-plane models: what the gateway relays between a client and an agent.

Field names are the wire's snake_case names; times are aware ``datetime``
objects (RFC 3339 UTC on the wire).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

ProcessState = Literal["running", "exited"]
SignalName = Literal["TERM", "KILL", "INT", "HUP", "QUIT", "USR1", "USR2"]
FileType = Literal["file", "directory", "symlink", "other"]
#: How output travels: UTF-8 text (undecodable bytes replaced) or base64 of the bytes.
OutputEncoding = Literal["utf-8", "base64"]
#: Which part of an over-cap stream an exec keeps.
KeepPart = Literal["head", "tail", "head_tail"]


# Every model below is a frozen keyword-only dataclass of a few fields, one per
# message: alike in shape to each other (and to the other model modules) on
# purpose, since each declares its own message of the contract.
@dataclass(frozen=True, kw_only=True)
class ExecRequest:
    """``POST /v1/exec``: run argv to completion."""

    command: list[str]
    cwd: str | None = None
    env: dict[str, str] | None = None
    timeout_ms: int | None = None
    # -- beyond the reference (feature "exec-output"; "users") -----------------
    #: Run as this account of the sandbox (name or numeric uid); default root.
    user: str | None = None
    #: "base64": stdout and stderr are base64 of the raw bytes.
    output_encoding: OutputEncoding | None = None
    #: Per-stream cap in bytes (default 1 MiB, at most ``EXEC_OUTPUT_MAX``).
    max_output_bytes: int | None = None
    #: What an over-cap stream keeps: its first bytes (default), its last, or both.
    keep: KeepPart | None = None

    def asks_beyond_reference(self) -> bool:
        """Whether the answer may carry fields the reference does not have."""
        return (
            self.output_encoding is not None
            or self.max_output_bytes is not None
            or self.keep is not None
        )


@dataclass(frozen=True, kw_only=True)
class ExecResult:
    """``POST /v1/exec``'s answer: how the command ended and its output."""

    exit_code: int
    stdout: str
    stderr: str
    duration_ms: int
    timed_out: bool
    truncated: bool
    #: Bytes of each stream not in the answer; only when the request asked for
    #: an output option (an old client never sees them).
    stdout_dropped: int | None = None
    stderr_dropped: int | None = None
    #: ``True`` when the sandbox's OOM killer killed a process (usually this
    #: command or one of its children, then ``exit_code`` 137) while the
    #: command ran; absent otherwise, and where the sandbox cannot tell.
    oom_killed: bool | None = None

    @property
    def ok(self) -> bool:
        """Exited 0 within its timeout."""
        return self.exit_code == 0 and not self.timed_out


@dataclass(frozen=True, kw_only=True)
class SpawnRequest:
    """``POST /v1/processes``: start argv and return at once."""

    command: list[str]
    cwd: str | None = None
    env: dict[str, str] | None = None
    # -- beyond the reference (features "stdin", "users") ----------------------
    #: Give the process a pipe for stdin (written with ``POST .../stdin``)
    #: instead of ``/dev/null``.
    stdin: bool | None = None
    user: str | None = None


@dataclass(frozen=True, kw_only=True)
class ProcessStatus:
    """A spawned process: its command, whether it runs, and how it ended."""

    process_id: str
    command: list[str]
    state: ProcessState
    started_at: datetime
    exit_code: int | None = None  # absent while running
    exited_at: datetime | None = None


@dataclass(frozen=True, kw_only=True)
class ProcessOutput(ProcessStatus):
    """``GET /v1/processes/{id}``: status plus output after the asked offsets."""

    stdout: str = ""
    stderr: str = ""
    stdout_next: int = 0
    stderr_next: int = 0
    stdout_dropped: int = 0
    stderr_dropped: int = 0


@dataclass(frozen=True, kw_only=True)
class ProcessList:
    """``GET /v1/processes``: every process the agent keeps."""

    processes: list[ProcessStatus] = field(default_factory=list)


@dataclass(frozen=True, kw_only=True)
class SignalRequest:
    """``POST /v1/processes/{id}/signal``; sent to the process group."""

    signal: str = "TERM"


@dataclass(frozen=True, kw_only=True)
class AgentInfo:
    """``GET /v1/info``: what this agent is and what it can do beyond the reference."""

    version: str
    features: list[str] = field(default_factory=list)


@dataclass(frozen=True, kw_only=True)
class AgentStats:
    """``GET /v1/stats`` (the host's call, not a client's): the guest's own
    memory in use, disk in use on ``/`` and network bytes."""

    memory_bytes: int
    memory_total_bytes: int
    disk_bytes: int
    net_rx_bytes: int
    net_tx_bytes: int
    #: The guest kernel's OOM kills since it booted.
    oom_kills: int = 0


# -- native files (feature "files") -----------------------------------------


@dataclass(frozen=True, kw_only=True)
class FileInfo:
    """One directory entry or a ``stat`` answer. ``mode`` is the permission bits."""

    name: str
    path: str
    type: FileType
    size: int
    mode: int
    mtime: datetime
    #: Owner, only where asked (``owner=true``; feature "users").
    uid: int | None = None
    gid: int | None = None
    owner: str | None = None


@dataclass(frozen=True, kw_only=True)
class DirListing:
    """A directory's entries."""

    path: str
    entries: list[FileInfo] = field(default_factory=list)


@dataclass(frozen=True, kw_only=True)
class MakeDirRequest:
    """``POST /v1/files/mkdir``."""

    path: str
    parents: bool = True
    mode: int | None = None


@dataclass(frozen=True, kw_only=True)
class ChmodRequest:
    """``POST /v1/files/chmod`` (feature "files-ops")."""

    path: str
    mode: int


@dataclass(frozen=True, kw_only=True)
class MoveRequest:
    """``POST /v1/files/move`` (feature "files-ops"): rename, replacing a file
    at ``destination`` only when ``overwrite``."""

    source: str
    destination: str
    overwrite: bool = False


@dataclass(frozen=True, kw_only=True)
class ExecEvent:
    """One line of a streamed exec answer (feature "live-output"): output as it
    was written (text, or base64 when the request asked for it), then, last,
    the result (its ``stdout``/``stderr`` hold only what no event carried)."""

    stdout: str | None = None
    stderr: str | None = None
    result: ExecResult | None = None


# -- terminals and ports (features "pty", "ports") ---------------------------


@dataclass(frozen=True, kw_only=True)
class PtyRequest:
    """First message of a ``/v1/pty`` WebSocket: what to start on a terminal."""

    command: list[str]
    cwd: str | None = None
    env: dict[str, str] | None = None
    rows: int = 24
    cols: int = 80
    term: str = "xterm-256color"
    #: The account to run as (feature "users"); absent: the default user.
    user: str | None = None


@dataclass(frozen=True, kw_only=True)
class PtyResize:
    """Text message on a ``/v1/pty`` WebSocket: ``{"type": "resize", "rows", "cols"}``."""

    type: Literal["resize"]
    rows: int
    cols: int


@dataclass(frozen=True, kw_only=True)
class PtyExit:
    """Last text message of a ``/v1/pty`` WebSocket before it closes (code 1000)."""

    type: Literal["exit"] = "exit"
    exit_code: int
