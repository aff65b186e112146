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

Beyond the reference: the command may run as another ``user``; its stdin
may be the request body (fed by a thread as it arrives, never held whole);
the answer may keep the tail or head and tail of an over-cap stream, with
its own cap, as text or base64 (:mod:`.output`); and it may be streamed as
NDJSON events while the command runs (:func:`stream`). When the client goes
away before the answer (its connection closes), the command's whole tree is
killed: an exec lives only as long as someone waits for it.
"""

from __future__ import annotations

import codecs
import contextlib
import os
import select
import signal
import threading
import time
from collections.abc import Callable, Generator, Iterator, Mapping

from podbay.errors import ApiError, ProtocolError
from podbay.wire import limits
from podbay.wire.codec import dumps
from podbay.wire.codes import ErrorCode
from podbay.wire.data import ExecEvent, ExecRequest, ExecResult

from . import guard, oom
from .environment import check_env, command_env
from .launch import Child, check_command, launch
from .output import Capture
from .reaper import Reaper
from .users import resolve

#: Reads request-body bytes into the buffer given; 0 at its end.
ReadBody = Callable[[memoryview], int]
#: True once the client's connection is closed (polled when it signals hang-up).
PeerGone = Callable[[], bool]

READ_SIZE = 64 * 1024
#: How much of a request body the stdin feeder takes at a time.
STDIN_READ_SIZE = 1024 * 1024
#: After the command exits, how long pipes a grandchild still holds are read.
EXIT_GRACE_SECONDS = 0.05
#: While pipes stay open, how often the loop checks whether the command exited.
EXIT_CHECK_SECONDS = 0.05
#: After a deadline kill, how long to wait for the kernel to deliver it.
KILL_WAIT_SECONDS = 2.0


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


#: ``fcntl`` F_SETPIPE_SZ (Linux): a stdin pipe of 1 MiB rather than 64 KiB
#: takes a request body's chunks with a sixteenth of the wake-ups.
_F_SETPIPE_SZ = 1031
STDIN_PIPE_SIZE = 1024 * 1024


def widen_pipe(fd: int) -> None:
    import fcntl

    with contextlib.suppress(OSError):
        fcntl.fcntl(fd, _F_SETPIPE_SZ, STDIN_PIPE_SIZE)


def output_options(req: ExecRequest) -> tuple[int, str, str]:
    """(cap, keep, encoding) of the request, checked."""
    cap = req.max_output_bytes
    if cap is None:
        cap = limits.EXEC_OUTPUT_CAP
    elif not 0 <= cap <= limits.EXEC_OUTPUT_MAX:
        raise ApiError(
            ErrorCode.REQUEST_INVALID, f"max_output_bytes must be 0 to {limits.EXEC_OUTPUT_MAX}"
        )
    return cap, req.keep or "head", req.output_encoding or "utf-8"


class Exec:
    """One started command, its stdin feeder and its deadline; :func:`run` or
    :func:`stream` then takes it to the end.

    ``stdin``: the request body to feed the command. ``peer``: the client
    connection's fd and a check that it is closed, to kill the command when
    the client leaves.
    """

    def __init__(
        self,
        reaper: Reaper,
        workspace: str,
        declared_env: Mapping[str, str],
        req: ExecRequest,
        *,
        stdin: ReadBody | None = None,
        default_user: str | None = None,
        peer: tuple[int, PeerGone] | None = None,
    ) -> None:
        check_command(req.command, req.cwd)
        if req.env and (problem := check_env(req.env, "env")):
            raise ApiError(ErrorCode.REQUEST_INVALID, problem)
        self.cap, self.keep, self.encoding = output_options(req)
        #: Whether the answer may carry fields the reference contract lacks.
        self.extended = req.asks_beyond_reference() or stdin is not None
        account = resolve(req.user, default_user)
        #: Who it runs as, for the command log.
        self.user = account.name
        timeout = deadline_ms(req.timeout_ms) / 1000
        cwd = resolve_cwd(workspace, req.cwd)
        self.started = time.monotonic()
        self.deadline = self.started + timeout
        self.oom_kills_before = oom.kills()
        self.child = launch(
            reaper,
            req.command,
            cwd,
            command_env(declared_env, req.env),
            stdin=stdin is not None,
            account=account,
        )
        self.peer = peer
        self.timed_out = False
        self.client_gone = False
        self.feeder: threading.Thread | None = None
        if stdin is not None:
            self.feeder = threading.Thread(
                target=self._feed, args=(stdin,), name="exec-stdin", daemon=True
            )
            try:
                self.feeder.start()
            except RuntimeError:  # no thread to be had (pids limit)
                self.child.kill_tree()
                self.child.close_pipes()
                raise ApiError(
                    ErrorCode.COMMAND_START_FAILED, "no thread to feed the command's stdin"
                ) from None

    def _feed(self, read: ReadBody) -> None:
        """Copy the request body into the command's stdin, then close it. Once the
        command exits or stops reading, the rest of the body is read and discarded
        (non-blocking writes: a grandchild holding the pipe never stalls this)."""
        fd = self.child.stdin_fd()
        if fd is not None:
            os.set_blocking(fd, False)
            widen_pipe(fd)
        poller = select.poll()
        if fd is not None:
            poller.register(fd, select.POLLOUT)
        # One buffer, filled straight from the socket and written from: no copies.
        buf = memoryview(bytearray(STDIN_READ_SIZE))
        try:
            while n := read(buf):
                view = buf[:n]
                while fd is not None and view:
                    try:
                        view = view[os.write(fd, view) :]
                    except BlockingIOError:
                        if self.child.exited.is_set():
                            fd = None
                        else:
                            poller.poll(int(EXIT_CHECK_SECONDS * 1000))
                    except OSError:  # EPIPE: the command closed its stdin or ended
                        fd = None
                if fd is None:
                    self.child.close_stdin()
        except (ProtocolError, OSError):  # the client's body broke off: it went away
            self.client_gone = True
            self.child.kill_tree()
        finally:
            self.child.close_stdin()

    def chunks(self) -> Generator[tuple[int, bytes], None, None]:
        """(fd, bytes) as the command writes them, until it has exited and its
        pipes are closed (or the grace after its exit ran out). Sets
        ``timed_out`` when the deadline hit and kills the tree when the client
        went away."""
        child = self.child
        streams = {child.stdout_fd(), child.stderr_fd()}
        poller = select.poll()
        for fd in streams:
            poller.register(fd, select.POLLIN)
        peer_fd = -1
        if self.peer is not None:
            peer_fd = self.peer[0]
            # No events asked: only POLLHUP comes, which a unix socket reports once
            # its peer closed it whole (a client that merely half-closed after its
            # request, as HTTP/1.0 clients may, still waits for the answer).
            # gVisor reports neither POLLHUP nor POLLRDHUP for its host-backed
            # socket's peer, only readability at the end of the stream: there a
            # half-close reads as gone too (the gateway, its only client, never
            # half-closes).
            poller.register(peer_fd, select.POLLIN if guard.active() else 0)
        stop_at: float | None = None  # set once the command exited (or was killed)
        try:
            while True:
                now = time.monotonic()
                if child.exited.is_set():
                    if not streams:
                        break
                    if stop_at is None:
                        stop_at = now + EXIT_GRACE_SECONDS
                if not self.timed_out and now >= self.deadline:
                    self.timed_out = True
                    self._kill()
                    stop_at = time.monotonic() + EXIT_GRACE_SECONDS
                    continue
                if stop_at is not None and now >= stop_at:
                    break
                limit = stop_at if stop_at is not None else self.deadline
                if not streams:
                    child.exited.wait(max(0.0, limit - now))
                    continue
                wait = limit - now if stop_at is not None else min(limit - now, EXIT_CHECK_SECONDS)
                for fd, _ in poller.poll(max(0, int(wait * 1000) + 1)):
                    if fd == peer_fd:
                        poller.unregister(fd)
                        peer_fd = -1
                        if self.peer is not None and self.peer[1]() is not False:
                            self.client_gone = True
                            self._kill()
                            stop_at = time.monotonic() + EXIT_GRACE_SECONDS
                        continue
                    data = os.read(fd, READ_SIZE)
                    if data:
                        yield fd, data
                    else:
                        poller.unregister(fd)
                        streams.discard(fd)
                if not streams:
                    # Both pipes closed: the command is exiting; its status is a moment away.
                    child.exited.wait(max(0.0, (stop_at or self.deadline) - time.monotonic()))
        finally:
            if not child.exited.is_set() and (self.client_gone or self.timed_out):
                child.exited.wait(KILL_WAIT_SECONDS)
            if streams:
                _discard_in_background(child, list(streams))
            else:
                child.close_pipes()

    def _kill(self) -> None:
        self.child.kill_tree()
        self.child.exited.wait(KILL_WAIT_SECONDS)

    def finish_feeding(self) -> None:
        """Wait until the whole request body is read (the connection needs it)."""
        if self.feeder is not None:
            self.feeder.join()

    def result(self, out: Capture, err: Capture, extended: bool) -> ExecResult:
        code = self.child.code if self.child.code is not None else 128 + signal.SIGKILL
        ended = self.child.exited_mono or time.monotonic()
        stdout, out_dropped = out.render(self.encoding)
        stderr, err_dropped = err.render(self.encoding)
        return ExecResult(
            exit_code=code,
            stdout=stdout,
            stderr=stderr,
            duration_ms=int((ended - self.started) * 1000),
            timed_out=self.timed_out,
            truncated=out.truncated or err.truncated,
            stdout_dropped=out_dropped if extended else None,
            stderr_dropped=err_dropped if extended else None,
            oom_killed=self.lost_to_oom() or None,
        )

    def lost_to_oom(self) -> bool:
        """Whether the sandbox's OOM killer killed a process while this ran."""
        before = self.oom_kills_before
        if before is None:
            return False
        after = oom.kills()
        return after is not None and after > before


def run(ex: Exec) -> ExecResult:
    """Take ``ex`` to completion (or its deadline) and report."""
    out, err = Capture(ex.cap, ex.keep), Capture(ex.cap, ex.keep)
    captures = {ex.child.stdout_fd(): out, ex.child.stderr_fd(): err}
    for fd, data in ex.chunks():
        captures[fd].add(data)
    ex.finish_feeding()
    return ex.result(out, err, ex.extended)


def stream(ex: Exec) -> Iterator[bytes]:
    """Yield NDJSON lines (:class:`ExecEvent`) as ``ex`` writes.

    The command started (or was refused) when ``ex`` was made, before the
    first line. With a stdin body, nothing is sent until the body is read
    whole (an HTTP/1.1 client reads the answer only after sending): what the
    command writes meanwhile is kept as by :func:`run` (cap, keep) and sent
    then. Text events never split a UTF-8 character. Closing the iterator (the
    client left) kills the tree.
    """
    out_fd, err_fd = ex.child.stdout_fd(), ex.child.stderr_fd()
    out, err = Capture(ex.cap, ex.keep), Capture(ex.cap, ex.keep)
    b64 = ex.encoding == "base64"
    decoders = {fd: codecs.getincrementaldecoder("utf-8")("replace") for fd in (out_fd, err_fd)}

    def event(fd: int, data: bytes, final: bool = False) -> bytes:
        if b64:
            import base64

            text = base64.b64encode(data).decode("ascii")
        else:
            text = decoders[fd].decode(data, final)
        if not text:
            return b""
        ev = ExecEvent(stdout=text) if fd == out_fd else ExecEvent(stderr=text)
        return dumps(ev) + b"\n"

    chunks = ex.chunks()
    finished = False
    try:
        if ex.feeder is not None:  # hold output until the body is in
            for fd, data in chunks:
                (out if fd == out_fd else err).add(data)
                if not ex.feeder.is_alive():
                    break
            ex.finish_feeding()
            for fd, cap in ((out_fd, out), (err_fd, err)):
                head, tail = cap.kept()
                if line := event(fd, head + tail):
                    yield line
        for fd, data in chunks:
            if line := event(fd, data):
                yield line
        for fd in (out_fd, err_fd):
            if line := event(fd, b"", final=True):
                yield line
        empty = Capture(0)
        result = ex.result(empty, empty, True)
        dropped_out = out.total - sum(map(len, out.kept()))
        dropped_err = err.total - sum(map(len, err.kept()))
        result = ExecResult(
            exit_code=result.exit_code,
            stdout="",
            stderr="",
            duration_ms=result.duration_ms,
            timed_out=result.timed_out,
            truncated=bool(dropped_out or dropped_err),
            stdout_dropped=dropped_out,
            stderr_dropped=dropped_err,
        )
        finished = True
        yield dumps(ExecEvent(result=result)) + b"\n"
    finally:
        if not finished:  # the client went away (or the send failed): end the command
            ex.child.kill_tree()
        chunks.close()


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
