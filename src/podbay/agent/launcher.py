"""Under the guard (gVisor), one launcher starts every command in their namespace.

:mod:`.guard` keeps sandbox code away from the agent by running commands in
a user namespace without the agent's id. Making a namespace per command
meant a full fork of the agent for each (a ``preexec_fn`` rules out vfork)
plus an ``unshare``, and fork is what gVisor's ptrace platform does worst:
it more than doubled the time of an exec ``true``. So the namespace is made once, by
the *launcher*: a process forked from the agent (at its first command, and
again whenever it is gone) that enters it, becomes root there, and starts
each command on the agent's request as an unguarded agent does (``Popen``
without ``preexec_fn``: a vfork, for root).

Where the runtime built it (with the host's C compiler, see
``runtime/oci/runsc.py``), the launcher is ``launcher.c``: the fork execs it
at once (``--launcher PATH``) and it makes the namespace itself. CPython's
vfork child resets every signal handler (~65 system calls) and reports
through a pipe, half of the system calls of an exec of ``true``, each a trap
under gVisor's ptrace platform; the program's child makes only the calls the
command needs. Without it, the launcher serves in Python (:func:`_serve`).

The agent sends argv, cwd, env, ids and the paths to try
(:func:`encode_request`) with the command's three standard streams as
descriptors (``SCM_RIGHTS``) and gets back the pid, or why nothing ran.
The launcher reaps its children and sends each exit code on a second
socket, read by a thread of the agent and handed to the
:class:`~.reaper.Reaper`'s callbacks. Orphans still go to the agent (the
sandbox's init), and so do running commands when the launcher dies: their
callbacks stay registered with the agent's reaper. The launcher's own OOM
score is :data:`~.oom.COMMAND_SCORE`, which commands inherit; it is in the
commands' pids cgroup (:mod:`.guestpids`), which they inherit too.

Trust runs one way. Commands are root in the launcher's namespace: they can
trace it, stop it, take its sockets. It holds nothing they lack (their own
argv, env and streams; it closed every other descriptor of the agent), and
the agent believes little of what comes back: answers are fixed-size
records, a pid is used only if it is not the agent's (nor its group's or
session's) and names a child of the launcher or nothing, and a launcher that
breaks that or does not answer within :data:`ANSWER_SECONDS` is killed and
replaced (a command it was asked for fails with ``COMMAND_START_FAILED``).

Call :func:`spawn` with the reaper's lock held, like any start of a child.
"""

from __future__ import annotations

import array
import contextlib
import errno
import os
import select
import signal
import socket
import struct
import subprocess
import threading
from collections.abc import Sequence
from typing import Any, NoReturn

from podbay.errors import LauncherGone, LaunchFailed

from . import guard, guestpids, oom
from .popen import popen_command
from .protocol import (
    FLAG_STREAM_SHIFT,
    FLAG_TERMINAL,
    INVALID,
    MAX_REQUEST,
    NO_CWD,
    NO_PROGRAM,
    REFUSED,
    STARTED,
)
from .reaper import Reaper

#: How long the agent waits for the launcher to come up or to answer.
ANSWER_SECONDS = 10.0
#: Exit code reported for a command whose status the launcher took with it.
LOST_CODE = 128 + signal.SIGKILL
#: The longest reason for a failed start the agent reads.
MAX_REASON = 1024

_LENGTH = struct.Struct("!I")  # a request's length; its descriptors ride on it
#: A request's fixed part: flags, uid, gid (-1: the launcher's own), then how
#: many groups, paths to try, argv and env entries (see :func:`encode_request`).
_BODY = struct.Struct("!IiiIIII")
_ANSWER = struct.Struct("!iiiH")  # pid, errno, what failed, reason length
_EXIT = struct.Struct("!ii")  # pid, exit code


_current: Launcher | None = None

#: The launcher as a program of its own (``launcher.c``, built by the runtime),
#: exec'd by the launcher once in its namespace; None: it serves in Python.
program: str | None = None


def spawn(
    reaper: Reaper,
    argv: Sequence[str],
    cwd: str,
    env: dict[str, str],
    streams: tuple[int | None, int | None, int | None],
    ids: tuple[int, int, list[int]] | None,
    *,
    terminal: bool = False,
) -> int:
    """Start ``argv`` through the launcher (started first if there is none);
    its pid, registered with nothing yet. ``streams``: stdin, stdout, stderr
    (None: /dev/null); ``ids``: uid, gid and groups, None for root; ``terminal``:
    make stdin its controlling terminal. Hold ``reaper.lock``.
    Raises :class:`LaunchFailed`."""
    global _current
    # The launcher's own /dev/null stands in for a None: the agent keeps none
    # open (sandbox code may open what the agent holds if its mode lets it).
    fds = [fd for fd in streams if fd is not None]
    given = [fd is not None for fd in streams]
    request = {
        "argv": list(argv),
        "cwd": cwd,
        "env": env,
        "ids": ids,
        "terminal": terminal,
        "given": given,
    }
    try:
        body = encode_request(request)
    except ValueError as exc:  # e.g. an environment the OS cannot take
        raise LaunchFailed(f"cannot start {argv[0]!r}: {exc}", invalid=True) from None
    if len(body) > MAX_REQUEST:  # past any execve's limit (and the launcher's)
        too_big = OSError(errno.E2BIG, os.strerror(errno.E2BIG), argv[0])
        raise LaunchFailed(os.strerror(errno.E2BIG), too_big)
    for attempt in (1, 2):
        if _current is None or not _current.alive:
            if _current is not None:
                _current.close()
            try:
                _current = Launcher.start(reaper)
            except (OSError, RuntimeError) as exc:  # no process or thread to be had
                raise LaunchFailed(f"cannot start the launcher of commands: {exc}") from None
        try:
            return _current.spawn(request, fds, body)
        except LauncherGone:
            _current.kill()
            if attempt == 2:
                raise LaunchFailed("the launcher of commands went away") from None
    raise AssertionError("unreachable")


def current_pid() -> int | None:
    """The launcher's pid while one may be running, None when there is none."""
    if _current is None or _current.reaped.is_set():
        return None
    return _current.pid


def retire(reaper: Reaper) -> bool:
    """End the launcher before the agent hibernates (the exec would leave it
    running with no one to ask it anything; the woken agent starts another at
    its first command). True when none is left; False when it still has a
    command of its own to report, or was not seen gone in time."""
    global _current
    with reaper.lock:
        current = _current
        if current is None:
            return True
        if current.running:
            return False
        current.kill()
    if not current.reaped.wait(ANSWER_SECONDS):
        return False
    with reaper.lock:
        if _current is current:
            current.close()
            _current = None
    return True


class Launcher:
    """The agent's side of one launcher process."""

    def __init__(self, pid: int, requests: socket.socket, exits: socket.socket) -> None:
        self.pid = pid
        self.requests = requests
        self.exits = exits
        self.alive = True
        #: Commands it started whose exit is still to come (under the reaper's lock).
        self.running: set[int] = set()
        self.reaped = threading.Event()
        self.reader: threading.Thread | None = None
        #: Pids an answer must not name: the agent, its group and session (fixed
        #: for its life: it never calls setsid or setpgid) and the launcher.
        self.not_commands = {os.getpid(), os.getpgrp(), os.getsid(0), pid}

    @classmethod
    def start(cls, reaper: Reaper) -> Launcher:
        """Fork the launcher and set up its namespace. Hold ``reaper.lock``."""
        requests, their_requests = socket.socketpair()
        exits, their_exits = socket.socketpair()
        unshared_r, unshared_w = os.pipe()
        mapped_r, mapped_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the launcher; its work is seen by the agent
            try:
                for ours in (requests, exits):
                    ours.close()
                os.close(unshared_r)
                os.close(mapped_w)
                # Into the commands' pids cgroup before anything runs: all
                # that the launcher starts is born there (see .guestpids).
                guestpids.join()
                if program is not None:
                    _exec_program(their_requests, their_exits, unshared_w, mapped_r)
                guard.enter_own_namespace(unshared_w, mapped_r)
                _serve(their_requests, their_exits)
            # A forked child never returns into the parent's code: it logs and exits.
            except BaseException as exc:  # noqa: BLE001
                with contextlib.suppress(OSError):
                    os.write(2, f"podbay-agent: the launcher stopped: {exc!r}\n".encode())
            os._exit(1)
        for theirs in (their_requests, their_exits):
            theirs.close()
        os.close(unshared_w)
        os.close(mapped_r)
        launcher = cls(pid, requests, exits)
        reaper.register(pid, lambda _: launcher._reaped())
        try:
            waiting = select.poll()
            waiting.register(unshared_r, select.POLLIN)
            if not waiting.poll(int(ANSWER_SECONDS * 1000)):
                raise LaunchFailed("the launcher of commands did not start")
            if os.read(unshared_r, 32) != str(pid).encode():
                raise LaunchFailed("the launcher of commands could not make its namespace")
            guard.map_ids(pid)
            os.write(mapped_w, b"1")
        except BaseException:
            launcher.kill()
            launcher.requests.close()
            launcher.exits.close()
            raise
        finally:
            os.close(unshared_r)
            os.close(mapped_w)
        # A blocking socket with kernel timeouts: a socket timeout would cost a
        # poll before every send and receive (each a trap under gVisor).
        bound = struct.pack("@ll", int(ANSWER_SECONDS), 0)
        for option in (socket.SO_RCVTIMEO, socket.SO_SNDTIMEO):
            requests.setsockopt(socket.SOL_SOCKET, option, bound)
        reader = threading.Thread(
            target=launcher._read_exits, args=(reaper,), name="launcher-exits", daemon=True
        )
        try:
            reader.start()
        except RuntimeError:
            launcher.kill()
            launcher.requests.close()
            launcher.exits.close()
            raise
        launcher.reader = reader
        return launcher

    def spawn(self, request: dict[str, Any], fds: list[int], body: bytes | None = None) -> int:
        """One command's pid (``body``: ``request`` encoded already). Raises
        :class:`LauncherGone` when the launcher is gone before taking the
        request, :class:`LaunchFailed` otherwise."""
        if body is None:
            body = encode_request(request)
        head = _LENGTH.pack(len(body))
        rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
        try:
            sent = self.requests.sendmsg([head, body], rights)
        except (BrokenPipeError, ConnectionResetError):
            raise LauncherGone from None
        except OSError as exc:
            self.kill()
            raise LaunchFailed(f"the launcher of commands refused the request: {exc}") from None
        try:
            if sent < len(head) + len(body):
                self.requests.sendall((head + body)[sent:])
            pid, code, failed, length = _ANSWER.unpack(_read(self.requests, _ANSWER.size))
            reason = _read(self.requests, min(length, MAX_REASON)) if length else b""
            if length > MAX_REASON:
                raise OSError("an answer too long")
        except (OSError, struct.error) as exc:
            if not self.alive:  # it went away meanwhile: killed by a command, maybe this one
                raise LaunchFailed(
                    "the launcher of commands went away while starting it (it may have run)"
                ) from None
            self.kill()
            raise LaunchFailed(f"the launcher of commands did not answer: {exc}") from None
        if failed != STARTED:
            text = reason.decode("utf-8", "replace")
            if failed in (NO_PROGRAM, NO_CWD):
                where = request["cwd"] if failed == NO_CWD else request["argv"][0]
                raise LaunchFailed(text, OSError(code, os.strerror(code), where))
            raise LaunchFailed(text or "cannot start", invalid=failed == INVALID)
        if not self._may_be_ours(pid):
            self.kill()
            raise LaunchFailed(f"the launcher of commands answered pid {pid}, not its own")
        self.running.add(pid)
        return int(pid)

    def _may_be_ours(self, pid: int) -> bool:
        """True when ``pid`` is not the agent, its group or session, and is a
        child of the launcher or nothing (a command that is gone already)."""
        if pid <= 1 or pid in self.not_commands:
            return False
        # os.open, not open(): a file object adds an fstat, an ioctl and two lseeks.
        try:
            fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
        except (FileNotFoundError, ProcessLookupError):
            return True
        except OSError:
            return False
        try:
            stat = os.read(fd, 4096)  # procfs gives the whole line in one read
        except ProcessLookupError:  # reaped meanwhile
            return True
        except OSError:
            return False
        finally:
            os.close(fd)
        try:
            state, parent = stat[stat.rindex(b")") + 2 :].split()[:2]
            return state == b"X" or int(parent) == self.pid  # X: being reaped, parent 0
        except ValueError:
            return False

    def _read_exits(self, reaper: Reaper) -> None:
        """The launcher's exit codes, to the reaper's callbacks, until it is gone."""
        try:
            while True:
                pid, code = _EXIT.unpack(_read(self.exits, _EXIT.size))
                with reaper.lock:
                    if pid not in self.running:
                        continue  # not one of ours: believe nothing of it
                    self.running.discard(pid)
                reaper.deliver(pid, code)
        except (OSError, struct.error):
            pass
        self.kill()
        self.exits.close()
        # Its running commands are the agent's children once it is reaped; a
        # status it took with it is lost: those commands count as killed.
        self.reaped.wait(ANSWER_SECONDS)
        with reaper.lock:
            left = list(self.running)
            self.running.clear()
        for pid in left:
            try:
                os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                reaper.deliver(pid, LOST_CODE)
            except OSError:
                pass

    def _reaped(self) -> None:
        self.alive = False
        self.reaped.set()

    def kill(self) -> None:
        """Stop using this launcher and kill it (the agent may: it is in a
        namespace the agent's user owns)."""
        self.alive = False
        with contextlib.suppress(OSError):
            if not self.reaped.is_set():
                os.kill(self.pid, signal.SIGKILL)
        # Shut, not closed: another thread may be using them (a closed number
        # could be reused under it). The next spawn closes them (close()).
        for sock in (self.requests, self.exits):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        """Once killed and replaced (hold ``reaper.lock``): free its request
        socket; its reader frees the other."""
        self.requests.close()


def encode_request(request: dict[str, Any]) -> bytes:
    """A request as the launcher reads it: :data:`_BODY`, the groups (``!I``
    each), then NUL-ended strings: cwd, the paths to try in turn (the PATH
    search subprocess makes, from the command's own PATH), argv, ``K=V`` env
    entries. Raises ValueError for what no argv or environment can hold, as
    subprocess would."""
    argv = [os.fsencode(arg) for arg in request["argv"]]
    env = {os.fsencode(k): os.fsencode(v) for k, v in request["env"].items()}
    if any(b"=" in key for key in env):
        raise ValueError("illegal environment variable name")
    name = argv[0]
    if os.path.dirname(name):
        paths = [name]
    else:
        paths = [os.path.join(os.fsencode(d), name) for d in os.get_exec_path(request["env"])]
    strings = [os.fsencode(request["cwd"]), *paths, *argv, *(k + b"=" + v for k, v in env.items())]
    if any(b"\0" in string for string in strings):
        raise ValueError("embedded null byte")
    uid, gid, groups = request["ids"] or (-1, -1, [])
    given = request["given"]
    flags = FLAG_TERMINAL if request["terminal"] else 0
    for n, there in enumerate(given):
        flags |= there << (FLAG_STREAM_SHIFT + n)
    head = _BODY.pack(flags, uid, gid, len(groups), len(paths), len(argv), len(env))
    return b"".join([head, *(struct.pack("!I", g) for g in groups), b"\0".join(strings), b"\0"])


def decode_request(body: bytes) -> dict[str, Any]:
    """What :func:`encode_request` made (for the launcher served in Python).
    Raises ValueError when it is not that."""
    flags, uid, gid, ngroups, npaths, nargs, nenv = _BODY.unpack_from(body)
    at = _BODY.size + 4 * ngroups
    groups = list(struct.unpack_from(f"!{ngroups}I", body, _BODY.size))
    strings = [os.fsdecode(s) for s in body[at:].split(b"\0")]
    if len(strings) != 2 + npaths + nargs + nenv or strings[-1] or not nargs:
        raise ValueError("a malformed request")
    argv = strings[1 + npaths : 1 + npaths + nargs]
    env: dict[str, str] = {}
    for entry in strings[1 + npaths + nargs : -1]:
        key, _, value = entry.partition("=")
        env[key] = value
    return {
        "argv": argv,
        "cwd": strings[0],
        "env": env,
        "ids": None if uid < 0 else (uid, gid, groups),
        "terminal": bool(flags & FLAG_TERMINAL),
        "given": [bool(flags >> (FLAG_STREAM_SHIFT + n) & 1) for n in range(3)],
    }


def _read(sock: socket.socket, size: int) -> bytes:
    """Exactly ``size`` bytes; OSError at the end of the stream."""
    data = bytearray()
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise OSError(errno.EPIPE, "the other side went away")
        data += chunk
    return bytes(data)


# -- the launcher process ----------------------------------------------------


def _settle(keep: set[int]) -> int:
    """Close every descriptor of the agent's but ``keep``, make /dev/null
    standard input, output and error (the agent's are not for commands) and
    raise our OOM score to the commands' (they inherit it). /dev/null's fd."""
    for name in os.listdir("/proc/self/fd"):  # the agent's listener, connections, …
        if name.isdigit() and int(name) not in keep:
            with contextlib.suppress(OSError):
                os.close(int(name))
    devnull = os.open(os.devnull, os.O_RDWR)  # 0: the lowest free
    for fd in (0, 1, 2):
        if fd != devnull:
            os.dup2(devnull, fd)
    with contextlib.suppress(OSError), open("/proc/self/oom_score_adj", "w") as f:
        f.write(str(oom.COMMAND_SCORE))
    return devnull


def _exec_program(
    requests: socket.socket, exits: socket.socket, unshared: int, mapped: int
) -> None:
    """Become :data:`program`, which makes the commands' namespace itself (as
    :func:`guard.enter_own_namespace`) and serves. Exec'd before the namespace
    is made, so that its memory belongs to the sandbox's user namespace, where
    the commands' root has no capability: it is not dumpable, so they cannot
    trace it. With an empty environment: nothing of the agent's is carried.
    Returns only when the exec failed (the launcher then serves in Python)."""
    assert program is not None
    kept = (requests.fileno(), exits.fileno(), unshared, mapped)
    devnull = _settle(set(kept))
    for fd in (*kept, devnull):
        os.set_inheritable(fd, True)
    try:
        argv = [program, *map(str, kept), f"{guard.foreign_caps():x}"]
        os.execve(program, argv, {})  # noqa: S606 - the runtime's program, no shell
    except OSError:
        for fd in (*kept, devnull):
            os.set_inheritable(fd, False)


def _serve(requests: socket.socket, exits: socket.socket) -> NoReturn:
    """Become the launcher (in its namespace already) and start commands until
    the agent goes away."""
    for sock in (requests, exits):
        sock.set_inheritable(False)  # as all it keeps, and the streams it receives
    devnull = _settle({requests.fileno(), exits.fileno()})
    # Caught, and so at their default again in every command (exec resets a
    # caught signal, not an ignored one): a `pkill python` in the sandbox,
    # which matches the launcher's name too, leaves it serving.
    for name in ("SIGHUP", "SIGINT", "SIGQUIT", "SIGTERM", "SIGUSR1", "SIGUSR2", "SIGALRM"):
        signal.signal(getattr(signal, name), _shrug)
    reaper = Reaper()
    reaper.start()
    requests.settimeout(None)
    while True:
        try:
            head, ancillary, _, _ = requests.recvmsg(
                _LENGTH.size,
                socket.CMSG_SPACE(3 * array.array("i").itemsize),
                socket.MSG_CMSG_CLOEXEC,
            )
        except OSError:
            os._exit(0)
        fds = array.array("i")
        for level, kind, data in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
        if len(head) < _LENGTH.size:
            if not head:
                os._exit(0)  # the agent went away
            head += _read(requests, _LENGTH.size - len(head))
        try:
            request = decode_request(_read(requests, _LENGTH.unpack(head)[0]))
        except (OSError, ValueError, struct.error):
            os._exit(1)
        with reaper.lock:
            try:
                answer = _start(request, list(fds), devnull, reaper, exits)
            finally:
                for fd in fds:
                    with contextlib.suppress(OSError):
                        os.close(fd)
        requests.sendall(answer)


def _shrug(signum: int, frame: object) -> None:
    """The launcher's handler of every signal it can catch: nothing."""


def _start(
    request: dict[str, Any], fds: list[int], devnull: int, reaper: Reaper, exits: socket.socket
) -> bytes:
    """Start one command with the streams ``fds`` (``devnull`` for those not
    given); hold ``reaper.lock``. The answer to send."""
    argv, cwd, ids, terminal = request["argv"], request["cwd"], request["ids"], request["terminal"]

    try:
        given = iter(fds)
        streams = [next(given) if there else devnull for there in request["given"]]
        if len(streams) != 3 or next(given, None) is not None:
            raise ValueError("the request came with other streams than it named")
        uid, gid, groups = (None, None, None) if ids is None else ids
        # Every descriptor here is close-on-exec (see _serve): no closing pass
        # in the child, a dozen system calls fewer (each one dear under ptrace).
        popen = popen_command(
            argv, streams, cwd, request["env"], uid, gid, groups, terminal, close_fds=False
        )
    except OSError as exc:
        failed = NO_CWD if exc.filename == cwd and argv[0] != cwd else NO_PROGRAM
        return _answer(0, exc.errno or errno.EINVAL, failed, exc.strerror or str(exc))
    except ValueError as exc:  # e.g. an environment the OS cannot take
        return _answer(0, 0, INVALID, f"cannot start {argv[0]!r}: {exc}")
    except subprocess.SubprocessError as exc:  # take_terminal failed: nothing ran
        return _answer(0, 0, REFUSED, f"cannot start {argv[0]!r}: {exc}")

    def exited(code: int) -> None:
        popen.returncode = code  # so that nothing in subprocess ever waits for it
        exits.sendall(_EXIT.pack(popen.pid, code))

    reaper.register(popen.pid, exited)
    return _answer(popen.pid, 0, STARTED, "")


def _answer(pid: int, code: int, failed: int, reason: str) -> bytes:
    data = reason.encode("utf-8", "replace")[:MAX_REASON]
    return _ANSWER.pack(pid, code, failed, len(data)) + data
