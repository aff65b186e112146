"""Spawned processes: start, poll output by offset, list, signal, forget.

Each process has a pump thread that drains its two pipes into two
:class:`~podbay.agent.ring.Ring` buffers (the newest 1 MiB per stream), always,
whether anyone polls or not: a slow reader never blocks a process. Polls read
the rings under the process's lock.

A process counts as ``exited`` once the reaper has its status and its pipes
are closed, or a short grace period after its exit if a background grandchild
still holds them; so a reader that stops at ``exited`` has seen all the
process wrote. The pump keeps collecting what such a grandchild writes until
the pipes close.

Beyond the reference: a poll may wait (``wait_ms``) until there is output
past its offsets or the process exited; output may come as base64 of the raw
bytes; a process spawned with ``stdin`` takes writes to its stdin, and a
close, as many times as needed; and it may run as another ``user``.

At most :data:`~podbay.wire.limits.MAX_PROCESSES` are tracked (running, or
exited and not yet forgotten); an exited one keeps its exit code and times
until ``DELETE`` forgets it.
"""

from __future__ import annotations

import os
import select
import signal
import threading
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta

from podbay.errors import ApiError
from podbay.wire import limits
from podbay.wire.codes import ErrorCode
from podbay.wire.data import ProcessOutput, ProcessStatus, SpawnRequest

from .environment import check_env, command_env
from .exec import resolve_cwd
from .launch import Child, check_command, launch
from .reaper import Reaper
from .ring import Ring
from .users import resolve

READ_SIZE = 64 * 1024
#: After the process exits, how long a poll waits for its pipes to close.
EXIT_GRACE_SECONDS = 0.1

SIGNALS: dict[str, int] = {name: getattr(signal, f"SIG{name}") for name in limits.SIGNAL_NAMES}


class Process:
    """One spawned command, its output and its fate."""

    def __init__(self, process_id: str, argv: list[str]) -> None:
        self.id = process_id
        self.argv = argv
        self.started_at = datetime.now(UTC)
        self.started_mono = time.monotonic()
        self.stdout = Ring(limits.PROCESS_OUTPUT_RETAINED)
        self.stderr = Ring(limits.PROCESS_OUTPUT_RETAINED)
        self.cond = threading.Condition()
        self.open_streams = 2
        self.stdout_closed = False
        self.stderr_closed = False
        self.forgotten = False
        self.child: Child | None = None
        self.stdin_lock = threading.Lock()
        #: Who it runs as, for the command log.
        self.user = "root"

    def _settle(self) -> bool:
        """True when the process counts as exited. Waits (briefly) for its
        pipes after the exit so the last output is not reported after it."""
        child = self.child
        if child is None or child.code is None or child.exited_mono is None:
            return False
        if self.open_streams:
            remaining = child.exited_mono + EXIT_GRACE_SECONDS - time.monotonic()
            if remaining > 0:
                self.cond.wait_for(lambda: self.open_streams == 0, remaining)
        return True

    def status(self) -> ProcessStatus:
        with self.cond:
            exited = self._settle()
            code, exited_at = self._fate(exited)
            # Spelled out again in output() below, on purpose: ProcessOutput
            # extends ProcessStatus on the wire, and naming each field keeps
            # both constructors checked by the type checker.
            return ProcessStatus(
                process_id=self.id,
                command=self.argv,
                state="exited" if exited else "running",
                started_at=self.started_at,
                exit_code=code,
                exited_at=exited_at,
            )

    def _news(self, stdout_from: int, stderr_from: int) -> bool:
        child = self.child
        return (
            self.stdout.total > stdout_from
            or self.stderr.total > stderr_from
            or child is None
            or child.code is not None
            or self.forgotten
        )

    def output(
        self, stdout_from: int, stderr_from: int, *, wait_ms: int = 0, encoding: str = "utf-8"
    ) -> ProcessOutput:
        with self.cond:
            if wait_ms > 0:
                self.cond.wait_for(lambda: self._news(stdout_from, stderr_from), wait_ms / 1000)
            exited = self._settle()
            code, exited_at = self._fate(exited)
            # A stream still open (a grandchild may hold it after the exit) holds
            # back an incomplete trailing character; a closed one gives all.
            raw = encoding == "base64"  # bytes: nothing held back for a character
            out, out_next, out_dropped = self.stdout.read_from(
                stdout_from, closed=self.stdout_closed or raw
            )
            err, err_next, err_dropped = self.stderr.read_from(
                stderr_from, closed=self.stderr_closed or raw
            )
            # The status fields as in status() above, on purpose (see there).
            return ProcessOutput(
                process_id=self.id,
                command=self.argv,
                state="exited" if exited else "running",
                started_at=self.started_at,
                exit_code=code,
                exited_at=exited_at,
                stdout=_encode(out, encoding),
                stderr=_encode(err, encoding),
                stdout_next=out_next,
                stderr_next=err_next,
                stdout_dropped=out_dropped,
                stderr_dropped=err_dropped,
            )

    def _fate(self, exited: bool) -> tuple[int | None, datetime | None]:
        """Exit code and time, once the process counts as exited."""
        child = self.child
        if not exited or child is None or child.exited_mono is None:
            return None, None
        elapsed = timedelta(seconds=child.exited_mono - self.started_mono)
        return child.code, self.started_at + elapsed

    def pump(self) -> None:
        """Drain both pipes into the rings until they close (the pump thread)."""
        child = self.child
        assert child is not None
        streams = {child.stdout_fd(): "stdout", child.stderr_fd(): "stderr"}
        poller = select.poll()
        for fd in streams:
            poller.register(fd, select.POLLIN)
        try:
            while streams:
                for fd, _ in poller.poll():
                    data = os.read(fd, READ_SIZE)
                    with self.cond:
                        if data:
                            if not self.forgotten:
                                ring: Ring = getattr(self, streams[fd])
                                ring.write(data)
                                self.cond.notify_all()  # a waiting poll has news
                            continue
                        poller.unregister(fd)
                        setattr(self, f"{streams.pop(fd)}_closed", True)
                        self.open_streams -= 1
                        self.cond.notify_all()
        finally:
            child.close_pipes()
            with self.cond:
                self.open_streams = 0
                self.stdout_closed = self.stderr_closed = True
                self.cond.notify_all()

    def write_stdin(self, read: Callable[[int], bytes], close: bool) -> int:
        """Copy a request body into the process's stdin; then close it if asked.
        Returns the bytes written. Blocks while the process does not read (the
        pipe is full), as a local writer would."""
        child = self.child
        fd = child.stdin_fd() if child is not None else None
        if fd is None or child is None:
            raise ApiError(
                ErrorCode.PROCESS_STDIN_CLOSED,
                f"process {self.id} has no open stdin (spawn it with "
                '"stdin": true; a closed stdin stays closed)',
            )
        written = 0
        with self.stdin_lock:  # two writers never interleave their bytes
            try:
                while data := read(READ_SIZE):
                    view = memoryview(data)
                    while view:
                        n = os.write(fd, view)
                        view = view[n:]
                        written += n
            except BrokenPipeError:
                child.close_stdin()
                raise ApiError(
                    ErrorCode.PROCESS_STDIN_CLOSED,
                    f"process {self.id} no longer reads its stdin ({written} bytes were written)",
                ) from None
            if close:
                child.close_stdin()
        return written


def _encode(data: bytes, encoding: str) -> str:
    if encoding == "base64":
        import base64

        return base64.b64encode(data).decode("ascii")
    return data.decode("utf-8", "replace")


class ProcessTable:
    """Every tracked process of this sandbox, by id."""

    def __init__(self, reaper: Reaper, workspace: str, declared_env: Mapping[str, str]) -> None:
        self._reaper = reaper
        self._workspace = workspace
        self._declared_env = declared_env
        self._lock = threading.Lock()
        self._procs: dict[str, Process] = {}

    def spawn(self, req: SpawnRequest, default_user: str | None = None) -> ProcessStatus:
        check_command(req.command, req.cwd)
        account = resolve(req.user, default_user)
        if req.env and (problem := check_env(req.env, "env")):
            raise ApiError(ErrorCode.REQUEST_INVALID, problem)
        env = command_env(self._declared_env, req.env)
        cwd = resolve_cwd(self._workspace, req.cwd)
        with self._lock:
            if len(self._procs) >= limits.MAX_PROCESSES:
                raise ApiError(
                    ErrorCode.PROCESS_LIMIT_REACHED,
                    f"{limits.MAX_PROCESSES} processes are tracked already; "
                    "kill (forget) one first",
                )
            proc = Process(_new_id(self._procs), list(req.command))
            proc.user = account.name
            proc.child = launch(
                self._reaper,
                req.command,
                cwd,
                env,
                on_exit=self._on_exit(proc),
                stdin=bool(req.stdin),
                account=account,
            )
            self._procs[proc.id] = proc
        try:
            threading.Thread(target=proc.pump, name=f"pump-{proc.id}", daemon=True).start()
        except RuntimeError as exc:  # no thread to be had (pids limit): undo the spawn
            with self._lock:
                self._procs.pop(proc.id, None)
            proc.child.kill_group()
            proc.child.close_pipes()
            raise ApiError(
                ErrorCode.COMMAND_START_FAILED,
                f"cannot collect the output of {req.command[0]!r}: {exc}",
            ) from None
        return proc.status()

    @staticmethod
    def _on_exit(proc: Process) -> Callable[[Child], None]:
        def notify(_: Child) -> None:
            with proc.cond:
                proc.cond.notify_all()

        return notify

    def get(self, process_id: str) -> Process:
        with self._lock:
            proc = self._procs.get(process_id)
        if proc is None:
            raise ApiError(ErrorCode.PROCESS_NOT_FOUND, f"no process {process_id!r}")
        return proc

    def list(self) -> list[ProcessStatus]:
        with self._lock:
            procs = list(self._procs.values())
        return [p.status() for p in procs]

    def signal(self, process_id: str, name: str) -> None:
        """Send ``name`` to the process's group. An exited process's group is
        left alone: its id may already belong to someone else."""
        signum = SIGNALS.get(name)
        if signum is None:
            allowed = ", ".join(limits.SIGNAL_NAMES)
            raise ApiError(
                ErrorCode.SIGNAL_INVALID, f"unknown signal {name!r}; use one of {allowed}"
            )
        proc = self.get(process_id)
        child = proc.child
        if child is not None and child.code is None:
            child.kill_group(signum)

    def forget(self, process_id: str) -> None:
        """Kill the process's tree if it is still running, then forget it."""
        with self._lock:
            proc = self._procs.pop(process_id, None)
        if proc is None:
            raise ApiError(ErrorCode.PROCESS_NOT_FOUND, f"no process {process_id!r}")
        child = proc.child
        if child is not None:
            child.kill_tree()
        with proc.cond:
            proc.forgotten = True
            # Free the output now; a pump still running discards what comes.
            proc.stdout = Ring(limits.PROCESS_OUTPUT_RETAINED)
            proc.stderr = Ring(limits.PROCESS_OUTPUT_RETAINED)

    def kill_all(self) -> None:
        """Shutdown: kill every running process's tree."""
        with self._lock:
            procs = list(self._procs.values())
        for proc in procs:
            if proc.child is not None:
                proc.child.kill_tree()


def _new_id(taken: Mapping[str, Process]) -> str:
    while True:
        candidate = os.urandom(5).hex()
        if candidate not in taken:
            return candidate
