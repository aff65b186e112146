"""Start one command: argv only, clean environment, its own process group.

Every command becomes the leader of a new session (and so of a new process
group), so a signal reaches everything it started (a shell's background
grandchild too) with one ``killpg``. A deadline or a kill takes its whole
tree, also what left the group or session (:mod:`.tree`). stdin is
``/dev/null``; stdout and stderr are pipes the caller drains.

Each command is started with a higher ``oom_score_adj`` than the agent's,
so the OOM killer takes commands before the agent (:mod:`.oom`).

Under the guard (gVisor, :mod:`.guard`) the agent does not fork: its
launcher starts each command in the commands' user namespace, with the same
streams, ids, session and refusals (:mod:`.launcher`).

A command that cannot be started at all (no such file, not executable,
argument list too long, no such ``cwd``) is refused with
``COMMAND_START_FAILED`` and the OS's reason: nothing ran.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from typing import IO

from podbay.errors import ApiError, LaunchFailed
from podbay.wire.codes import ErrorCode

from . import guard, launcher, oom
from .popen import popen_command
from .reaper import Reaper
from .tree import kill_tree
from .users import ROOT, Account, command_identity


class Child:
    """A started command. The reaper fills in ``code`` when it exits."""

    def __init__(
        self,
        pid: int,
        streams: tuple[IO[bytes] | None, IO[bytes] | None, IO[bytes] | None],
        popen: subprocess.Popen[bytes] | None = None,
    ) -> None:
        # Kept until reaped, with its returncode set by us, so that neither
        # Popen.__del__ nor subprocess._cleanup ever waits for it.
        self.popen = popen
        self.pid = pid
        #: Our ends of its stdin, stdout and stderr pipes (None: not a pipe).
        self.streams = streams
        self.code: int | None = None
        self.exited_mono: float | None = None
        self.exited = threading.Event()
        self.on_exit: Callable[[Child], None] | None = None

    def _reaped(self, code: int) -> None:
        self.code = code
        if self.popen is not None:
            self.popen.returncode = code
        self.exited_mono = time.monotonic()
        self.exited.set()
        if self.on_exit is not None:
            self.on_exit(self)

    def kill_tree(self) -> None:
        """SIGKILL everything the command started, also what left its process
        group or session (see :mod:`.tree`), while the command itself runs."""
        if self.code is None:
            kill_tree(self.pid)

    def kill_group(self, signum: int = signal.SIGKILL) -> None:
        """Send ``signum`` to the command's whole process group, if any is left."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, signum)

    def stdin_fd(self) -> int | None:
        """The write end of the command's stdin pipe; None without one or once closed."""
        pipe = self.streams[0]
        if pipe is None or pipe.closed:
            return None
        return pipe.fileno()

    def close_stdin(self) -> None:
        if self.streams[0] is not None:
            with contextlib.suppress(OSError):
                self.streams[0].close()

    def stdout_fd(self) -> int:
        assert self.streams[1] is not None
        return self.streams[1].fileno()

    def stderr_fd(self) -> int:
        assert self.streams[2] is not None
        return self.streams[2].fileno()

    def close_pipes(self) -> None:
        for pipe in self.streams:
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()


def check_command(argv: list[str], cwd: str | None) -> None:
    """Refuse what cannot be an argv (empty, NUL characters) before forking."""
    if not argv:
        raise ApiError(ErrorCode.REQUEST_INVALID, "command must name at least the program")
    if not argv[0]:
        raise ApiError(ErrorCode.REQUEST_INVALID, "command[0] must not be empty")
    if any("\0" in arg for arg in argv):
        raise ApiError(ErrorCode.REQUEST_INVALID, "command must not contain NUL characters")
    if cwd is not None and "\0" in cwd:
        raise ApiError(ErrorCode.REQUEST_INVALID, "cwd must not contain NUL characters")


def launch(
    reaper: Reaper,
    argv: list[str],
    cwd: str,
    env: Mapping[str, str],
    on_exit: Callable[[Child], None] | None = None,
    *,
    stdin: bool = False,
    account: Account = ROOT,
) -> Child:
    """Start ``argv`` in ``cwd`` with exactly ``env`` (``HOME``/``USER`` set for
    another ``account``); refuse when nothing ran. ``stdin``: give it a pipe."""
    stdin_pipe = subprocess.PIPE if stdin else subprocess.DEVNULL
    streams = (stdin_pipe, subprocess.PIPE, subprocess.PIPE)
    return _start(reaper, argv, cwd, env, account, streams, on_exit=on_exit)


def launch_on_terminal(
    reaper: Reaper,
    argv: list[str],
    cwd: str,
    env: Mapping[str, str],
    terminal: int,
    *,
    account: Account = ROOT,
) -> Child:
    """Start ``argv`` with the terminal ``terminal`` (a pty's follower side) as its
    standard streams and controlling terminal, leading a session of its own, as
    ``account`` (which then owns the terminal, as a login would)."""

    def own_terminal(uid: int | None) -> None:
        if uid is not None or guard.active():  # a guarded agent's pty is its own
            with contextlib.suppress(OSError):
                os.fchown(terminal, uid or 0, -1)

    streams = (terminal, terminal, terminal)
    return _start(
        reaper,
        argv,
        cwd,
        env,
        account,
        streams,
        before=own_terminal,
        terminal=True,
    )


def _start(
    reaper: Reaper,
    argv: list[str],
    cwd: str,
    env: Mapping[str, str],
    account: Account,
    streams: tuple[int, int, int],
    *,
    on_exit: Callable[[Child], None] | None = None,
    before: Callable[[int | None], None] | None = None,
    terminal: bool = False,
) -> Child:
    """Start ``argv`` as ``account`` leading a new session with ``streams`` as
    its stdin, stdout and stderr; registered with ``reaper`` before it can exit.
    ``before`` gets the account's uid first (to hand it what it must own);
    ``terminal``: stdin becomes its controlling terminal (:func:`.popen.take_terminal`,
    run after ``setsid`` in the child only)."""
    env = dict(env)
    uid, gid, groups = command_identity(account, env)
    if before is not None:
        before(uid)
    if guard.active():
        ids = None if uid is None or gid is None else (uid, gid, groups or [])
        return _start_launched(reaper, argv, cwd, env, ids, streams, on_exit, terminal)
    with reaper.lock:
        try:
            with oom.spawning():
                popen = popen_command(argv, streams, cwd, env, uid, gid, groups, terminal)
        except OSError as exc:
            raise _start_failed(exc, argv, cwd) from None
        except ValueError as exc:  # e.g. an environment the OS cannot take
            raise ApiError(ErrorCode.REQUEST_INVALID, f"cannot start {argv[0]!r}: {exc}") from None
        except subprocess.SubprocessError as exc:  # preexec_fn failed: nothing ran
            raise ApiError(
                ErrorCode.COMMAND_START_FAILED, f"cannot start {argv[0]!r}: {exc}"
            ) from None
        oom.raise_command(popen.pid)
        child = Child(popen.pid, (popen.stdin, popen.stdout, popen.stderr), popen)
        child.on_exit = on_exit
        reaper.register(popen.pid, child._reaped)
    return child


def _start_launched(
    reaper: Reaper,
    argv: list[str],
    cwd: str,
    env: dict[str, str],
    ids: tuple[int, int, list[int]] | None,
    streams: tuple[int, int, int],
    on_exit: Callable[[Child], None] | None,
    terminal: bool,
) -> Child:
    """:func:`_start` under the guard: the launcher starts the command in the
    commands' user namespace (:mod:`.launcher`); the same streams, the same refusals."""
    ours: list[IO[bytes] | None] = [None, None, None]
    theirs: list[int] = []  # their ends of new pipes: closed here once sent
    fds: list[int | None] = []
    try:
        for n, stream in enumerate(streams):
            if stream == subprocess.PIPE:
                read, write = os.pipe()
                mine, their = (write, read) if n == 0 else (read, write)
                ours[n] = open(mine, "wb" if n == 0 else "rb", buffering=0)  # noqa: SIM115
                theirs.append(their)
                fds.append(their)
            else:
                fds.append(None if stream == subprocess.DEVNULL else stream)
        with reaper.lock:
            try:
                pid = launcher.spawn(
                    reaper, argv, cwd, env, (fds[0], fds[1], fds[2]), ids, terminal=terminal
                )
            except LaunchFailed as exc:
                if exc.error is not None:
                    raise _start_failed(exc.error, argv, cwd) from None
                code = ErrorCode.REQUEST_INVALID if exc.invalid else ErrorCode.COMMAND_START_FAILED
                raise ApiError(code, str(exc)) from None
            child = Child(pid, (ours[0], ours[1], ours[2]))
            child.on_exit = on_exit
            reaper.register(pid, child._reaped)
    except BaseException:
        for pipe in ours:
            if pipe is not None:
                pipe.close()
        raise
    finally:
        for fd in theirs:
            os.close(fd)
    return child


def _start_failed(exc: OSError, argv: list[str], cwd: str) -> ApiError:
    reason = exc.strerror or str(exc)
    if exc.filename == cwd and argv[0] != cwd:
        return ApiError(ErrorCode.COMMAND_START_FAILED, f"cannot use cwd {cwd!r}: {reason}")
    return ApiError(ErrorCode.COMMAND_START_FAILED, f"cannot start {argv[0]!r}: {reason}")
