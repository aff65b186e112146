"""Start one command: argv only, clean environment, its own process group.

Every command becomes the leader of a new session (and so of a new process
group), so a signal reaches everything it started (a shell's background
grandchild too) with one ``killpg``. A deadline or a kill takes its whole
tree, also what left the group or session (:mod:`.tree`). stdin is
``/dev/null``; stdout and stderr are pipes the caller drains.

Each command is started with a higher ``oom_score_adj`` than the agent's,
so the OOM killer takes commands before the agent (:mod:`.oom`).

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

from podbay.errors import ApiError
from podbay.wire.codes import ErrorCode

from . import guard, oom
from .reaper import Reaper
from .tree import kill_tree
from .users import ROOT, Account, command_identity


class Child:
    """A started command. The reaper fills in ``code`` when it exits."""

    def __init__(self, popen: subprocess.Popen[bytes]) -> None:
        # Kept until reaped, with its returncode set by us, so that neither
        # Popen.__del__ nor subprocess._cleanup ever waits for it.
        self.popen = popen
        self.pid = popen.pid
        self.code: int | None = None
        self.exited_mono: float | None = None
        self.exited = threading.Event()
        self.on_exit: Callable[[Child], None] | None = None

    def _reaped(self, code: int) -> None:
        self.code = code
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
        pipe = self.popen.stdin
        if pipe is None or pipe.closed:
            return None
        return pipe.fileno()

    def close_stdin(self) -> None:
        if self.popen.stdin is not None:
            with contextlib.suppress(OSError):
                self.popen.stdin.close()

    def stdout_fd(self) -> int:
        assert self.popen.stdout is not None
        return self.popen.stdout.fileno()

    def stderr_fd(self) -> int:
        assert self.popen.stderr is not None
        return self.popen.stderr.fileno()

    def close_pipes(self) -> None:
        for pipe in (self.popen.stdin, self.popen.stdout, self.popen.stderr):
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
        preexec_fn=_take_terminal,  # runs after setsid, in the child only
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
    preexec_fn: Callable[[], None] | None = None,
) -> Child:
    """Start ``argv`` as ``account`` leading a new session with ``streams`` as
    its stdin, stdout and stderr; registered with ``reaper`` before it can exit.
    ``before`` gets the account's uid first (to hand it what it must own)."""
    env = dict(env)
    uid, gid, groups = command_identity(account, env)
    if before is not None:
        before(uid)
    entry: guard.Entry | None = None
    with reaper.lock:
        try:
            if guard.active():
                # The command's own user namespace (see .guard): its ids are set
                # there, not by Popen in the agent's namespace.
                entry = guard.Entry(uid or 0, gid or 0, [0] if groups is None else groups)
                uid = gid = groups = None
                preexec_fn = _chain(entry.enter, preexec_fn)
            with oom.spawning():
                popen = subprocess.Popen(
                    argv,
                    stdin=streams[0],
                    stdout=streams[1],
                    stderr=streams[2],
                    cwd=cwd,
                    env=env,
                    start_new_session=True,
                    close_fds=True,
                    bufsize=0,
                    user=uid,
                    group=gid,
                    extra_groups=groups,
                    preexec_fn=preexec_fn,
                )
        except OSError as exc:
            raise _start_failed(exc, argv, cwd) from None
        except ValueError as exc:  # e.g. an environment the OS cannot take
            raise ApiError(ErrorCode.REQUEST_INVALID, f"cannot start {argv[0]!r}: {exc}") from None
        except subprocess.SubprocessError as exc:  # preexec_fn failed: nothing ran
            raise ApiError(
                ErrorCode.COMMAND_START_FAILED, f"cannot start {argv[0]!r}: {exc}"
            ) from None
        finally:
            if entry is not None:
                entry.close()
        oom.raise_command(popen.pid)
        child = Child(popen)
        child.on_exit = on_exit
        reaper.register(popen.pid, child._reaped)
    return child


def _chain(first: Callable[[], None], then: Callable[[], None] | None) -> Callable[[], None]:
    def both() -> None:
        first()
        if then is not None:
            then()

    return both


def _take_terminal() -> None:
    """Make standard input (the pty) the new session's controlling terminal, so
    that Ctrl-C typed on it reaches the foreground process group as SIGINT."""
    import fcntl
    import termios

    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


def _start_failed(exc: OSError, argv: list[str], cwd: str) -> ApiError:
    reason = exc.strerror or str(exc)
    if exc.filename == cwd and argv[0] != cwd:
        return ApiError(ErrorCode.COMMAND_START_FAILED, f"cannot use cwd {cwd!r}: {reason}")
    return ApiError(ErrorCode.COMMAND_START_FAILED, f"cannot start {argv[0]!r}: {reason}")
