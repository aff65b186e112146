"""``POST /v1/exec``: run a command to completion and answer with its output.

Rules (DESIGN.md, "Data plane"): stdout and stderr are each capped at
1 MiB; past the cap the pipes are still drained (so the command never blocks
on a full pipe) and ``truncated`` is set. At the deadline the command's whole
tree (its group, its session, their descendants) is killed and the answer
comes at once with ``timed_out``. A command killed by signal N reports ``128+N``.

A command may exit while a background grandchild still holds its pipes
(``sh -c 'server &'``). The answer does not wait for that grandchild: once the
command itself has exited, whatever is readily available is read for a short
grace period, then the answer goes out and the grandchild is left running; a
daemon thread keeps draining (and discarding) its output so it never blocks or
dies of SIGPIPE.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import threading
import time
from collections.abc import Mapping

from podbay.errors import ApiError
from podbay.wire import limits
from podbay.wire.codes import ErrorCode
from podbay.wire.data import ExecRequest, ExecResult

from .environment import check_env, command_env
from .launch import Child, check_command, launch
from .reaper import Reaper
from .ring import incomplete_tail

READ_SIZE = 64 * 1024
#: After the command exits, how long pipes a grandchild still holds are read.
EXIT_GRACE_SECONDS = 0.05
#: While pipes stay open, how often the loop checks whether the command exited.
EXIT_CHECK_SECONDS = 0.05
#: After a deadline kill, how long to wait for the kernel to deliver it.
KILL_WAIT_SECONDS = 2.0


class _Capture:
    """One stream's output up to the cap; the rest is counted, not kept."""

    __slots__ = ("cap", "data", "truncated")

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.data = bytearray()
        self.truncated = False

    def add(self, chunk: bytes) -> None:
        room = self.cap - len(self.data)
        if len(chunk) > room:
            self.truncated = True
            chunk = chunk[:room]
        if chunk:
            self.data += chunk

    def text(self) -> str:
        data = self.data
        if self.truncated:
            # The cut may fall inside a character whose rest was discarded.
            cut = incomplete_tail(data)
            if cut:
                data = data[: len(data) - cut]
        return data.decode("utf-8", "replace")


def resolve_cwd(workspace: str, cwd: str | None) -> str:
    """``cwd`` relative to the workspace; the workspace when absent."""
    if not cwd:
        return workspace
    return os.path.join(workspace, cwd)


def deadline_ms(timeout_ms: int | None) -> int:
    """The request's deadline, checked: default 60 s, at most one day."""
    if timeout_ms is None:
        return limits.EXEC_DEFAULT_TIMEOUT_MS
    if timeout_ms <= 0:
        raise ApiError(ErrorCode.REQUEST_INVALID, "timeout_ms must be positive")
    return min(timeout_ms, limits.EXEC_MAX_TIMEOUT_MS)


def run(reaper: Reaper, workspace: str, declared_env: Mapping[str, str],
        req: ExecRequest) -> ExecResult:
    """Run ``req`` to completion (or its deadline) and report."""
    check_command(req.command, req.cwd)
    if req.env and (problem := check_env(req.env, "env")):
        raise ApiError(ErrorCode.REQUEST_INVALID, problem)
    timeout = deadline_ms(req.timeout_ms) / 1000
    cwd = resolve_cwd(workspace, req.cwd)
    started = time.monotonic()
    child = launch(reaper, req.command, cwd, command_env(declared_env, req.env))
    out, err = _Capture(limits.EXEC_OUTPUT_CAP), _Capture(limits.EXEC_OUTPUT_CAP)
    timed_out = _collect(child, {child.stdout_fd(): out, child.stderr_fd(): err},
                         started + timeout)
    code = child.code if child.code is not None else 128 + signal.SIGKILL
    ended = child.exited_mono or time.monotonic()
    return ExecResult(
        exit_code=code, stdout=out.text(), stderr=err.text(),
        duration_ms=int((ended - started) * 1000), timed_out=timed_out,
        truncated=out.truncated or err.truncated,
    )


def _collect(child: Child, streams: dict[int, _Capture], deadline: float) -> bool:
    """Drain the pipes until the command has exited and they are closed (or
    the grace period after its exit ran out). True when the deadline hit."""
    poller = select.poll()
    for fd in streams:
        poller.register(fd, select.POLLIN)
    timed_out = False
    stop_at: float | None = None  # set once the command exited (or was killed)
    try:
        while True:
            now = time.monotonic()
            if child.exited.is_set():
                if not streams:
                    break
                if stop_at is None:
                    stop_at = now + EXIT_GRACE_SECONDS
            if not timed_out and now >= deadline:
                timed_out = True
                child.kill_tree()
                child.exited.wait(KILL_WAIT_SECONDS)
                stop_at = time.monotonic() + EXIT_GRACE_SECONDS
                continue
            if stop_at is not None and now >= stop_at:
                break
            limit = stop_at if stop_at is not None else deadline
            if not streams:
                child.exited.wait(max(0.0, limit - now))
                continue
            wait = limit - now if stop_at is not None else min(limit - now, EXIT_CHECK_SECONDS)
            for fd, _ in poller.poll(max(0, int(wait * 1000) + 1)):
                data = os.read(fd, READ_SIZE)
                if data:
                    streams[fd].add(data)
                else:
                    poller.unregister(fd)
                    del streams[fd]
            if not streams:
                # Both pipes closed: the command is exiting; its status is a moment away.
                child.exited.wait(max(0.0, (stop_at or deadline) - time.monotonic()))
    finally:
        if streams:
            _discard_in_background(child, list(streams))
        else:
            child.close_pipes()
    return timed_out


def _discard_in_background(child: Child, fds: list[int]) -> None:
    """Keep reading pipes a background process still holds, then close them."""

    def drain() -> None:
        poller = select.poll()
        for fd in fds:
            poller.register(fd, select.POLLIN)
        open_fds = set(fds)
        with contextlib.suppress(OSError):
            while open_fds:
                for fd, _ in poller.poll():
                    if not os.read(fd, READ_SIZE):
                        poller.unregister(fd)
                        open_fds.discard(fd)
        child.close_pipes()

    try:
        threading.Thread(target=drain, name="exec-drain", daemon=True).start()
    except RuntimeError:  # no thread to be had (pids limit): stop reading instead
        child.close_pipes()
