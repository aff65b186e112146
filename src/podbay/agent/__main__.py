"""Start the agent: ``python -m podbay.agent --socket PATH`` (or ``--listen``, ``--fd``).

Inside a sandbox the runtime starts it as the container's init with the
image's bare interpreter and a read-only staged copy of the package::

    python3.11 -I -S -c "import sys; sys.path.insert(0, '<staged>'); \\
        from podbay.agent.__main__ import main; sys.exit(main())" --fd 3 [--env-file F]

``--fd N`` serves on an already-listening unix socket the runtime created on
the host and passed in, so there is no start-up race: connections queue in
the socket until the agent accepts them.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import stat
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from types import FrameType

from podbay.errors import UsageError as UsageError  # re-exported: defined in the one tree
from podbay.wire import limits

from . import VERSION, guard, guestpids, launcher, oom, park
from .app import App, protocol_refusal
from .environment import EnvFileError, load_env_file
from .hibernate import Hibernation, alone
from .http import Server
from .reaper import Reaper, become_subreaper

#: Connection and pump threads need little stack; this keeps virtual memory small.
THREAD_STACK_BYTES = 1024 * 1024


USAGE = """usage: podbay agent (--socket PATH | --listen HOST:PORT | --fd N)
                    [--workspace DIR] [--env-file PATH] [--guard-uid N] [--oom-fd N]
                    [--launcher PATH] [--pids-max N] [--waiter PATH]

Run the sandbox agent (inside a sandbox).

  --socket PATH       serve on a new unix socket at PATH
  --listen HOST:PORT  serve on TCP (local debugging)
  --fd N              serve on an inherited, already-listening socket
  --workspace DIR     default cwd and base of relative paths (default /workspace)
  --env-file PATH     JSON object of variables given to every command
  --guard-uid N       run as uid N, commands in user namespaces without it
                      (under a kernel that cannot protect the agent: gVisor)
  --oom-fd N          our own /proc/self/oom_score_adj, opened for us
  --launcher PATH     under --guard-uid, the launcher program (launcher.c) to
                      start commands with (default: the launcher in Python)
  --pids-max N        under --guard-uid, confine commands to a pids cgroup of
                      the sandbox's kernel that holds at most N (gVisor)
  --waiter PATH       the program (waiter.c) an idle agent hibernates into
                      (default: a bare Python interpreter; see hibernate.py)
"""


@dataclass
class Options:
    """The agent's command-line options."""

    socket: str | None = None
    listen: str | None = None
    fd: int | None = None
    workspace: str = limits.WORKSPACE
    env_file: str | None = None
    guard_uid: int | None = None
    oom_fd: int | None = None
    launcher: str | None = None
    pids_max: int | None = None
    waiter: str | None = None


def parse_args(argv: list[str]) -> Options:
    """The options in ``argv``. Hand-rolled rather than argparse: a few options,
    and argparse costs several ms of every sandbox's start-up.

    >>> parse_args(["--fd", "3", "--env-file=/e.json"])  # doctest: +NORMALIZE_WHITESPACE
    Options(socket=None, listen=None, fd=3, workspace='/workspace', env_file='/e.json',
            guard_uid=None, oom_fd=None, launcher=None, pids_max=None, waiter=None)
    """
    opts = Options()
    names = {
        "--socket",
        "--listen",
        "--fd",
        "--workspace",
        "--env-file",
        "--guard-uid",
        "--oom-fd",
        "--launcher",
        "--pids-max",
        "--waiter",
    }
    args = list(argv)
    while args:
        arg = args.pop(0)
        name, eq, value = arg.partition("=")
        if name not in names:
            raise UsageError(f"unknown argument {arg!r}")
        if not eq:
            if not args:
                raise UsageError(f"{name} needs a value")
            value = args.pop(0)
        if name in ("--fd", "--guard-uid", "--oom-fd", "--pids-max"):
            if not value.isdigit():
                raise UsageError(f"{name} wants a number, got {value!r}")
            setattr(opts, name[2:].replace("-", "_"), int(value))
        else:
            setattr(opts, name[2:].replace("-", "_"), value)
    given = [n for n in ("socket", "listen", "fd") if getattr(opts, n) is not None]
    if len(given) != 1:
        raise UsageError("exactly one of --socket, --listen, --fd is required")
    return opts


def make_listener(args: Options) -> socket.socket:
    """The listening socket the options ask for."""
    if args.fd is not None:
        sock = socket.socket(fileno=args.fd)
        if sock.type != socket.SOCK_STREAM:
            raise OSError(f"fd {args.fd} is not a stream socket")
        sock.set_inheritable(False)
        return sock
    if args.listen is not None:
        host, sep, port = args.listen.rpartition(":")
        if not sep or not port.isdigit():
            raise OSError(f"--listen wants HOST:PORT, got {args.listen!r}")
        host = host.strip("[]") or "127.0.0.1"
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        return socket.create_server((host, int(port)), family=family, backlog=128)
    path = args.socket
    if path is None:  # pragma: no cover - parse_args requires one of the three
        raise OSError("no socket to serve on")
    with contextlib.suppress(FileNotFoundError):
        if stat.S_ISSOCK(os.lstat(path).st_mode):
            os.unlink(path)  # a stale socket from an earlier run; anything else stays
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(path)
    # Whoever can connect runs commands as the agent's user: owner only. Set
    # before listen(), so no connection can get in with the looser mode.
    try:
        os.chmod(path, 0o600)
    except PermissionError:
        # A socket made on the host for us (gVisor's gofer) takes no chmod; then
        # its directory must keep everyone else out.
        if os.stat(os.path.dirname(path) or ".").st_mode & 0o077:
            raise
    sock.listen(128)
    return sock


def _stop(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(0)


#: PID 1's command line as ``ps`` in a sandbox shows it.
TITLE = b"podbay-agent"


def retitle(title: bytes = TITLE) -> None:
    """Write ``title`` over this process's command line: the kernel's argv area,
    which ``/proc/1/cmdline`` (and so ``ps``) reads. The sandbox's PID 1 is
    started with the loader's options and the whole bootstrap code as argv,
    which ``ps`` showed as its command; nothing reads that area after start-up
    (``sys.argv`` and a hibernation's re-exec use Python's own copy).

    The argv strings lie end to end (Linux and gVisor alike lay them out so):
    the program's own start at glibc's ``program_invocation_name`` and run for
    ``sys.orig_argv``; the loader's options, when it was started through the
    loader, come before; ``/proc/self/cmdline`` is the whole area. The area is
    only written when our memory there reads back exactly as that file.

    A write to our own memory with ctypes: no capability (``PR_SET_MM`` would
    want ``CAP_SYS_RESOURCE``) and no file (under runc the agent, non-dumpable,
    may not open its own ``/proc/self/mem``, by design). ctypes is the guard's
    already under gVisor; under runc this adds its import to the start.
    """
    try:
        with open("/proc/self/cmdline", "rb") as f:
            line = f.read()
    except OSError:
        return
    if len(line) <= len(title):
        return
    import ctypes

    try:
        program = ctypes.c_void_p.in_dll(ctypes.CDLL(None), "program_invocation_name").value
    except (OSError, ValueError):
        return
    if not program or ctypes.string_at(program) != os.fsencode(sys.orig_argv[0]):
        return  # not the program's argv[0]: nothing below it is known
    end = program + sum(len(os.fsencode(arg)) + 1 for arg in sys.orig_argv)
    start = end - len(line)
    if ctypes.string_at(start, len(line)) != line:
        return  # not laid out as expected: leave it
    # NUL-filled to the end: the line ends at the title, and the area's last
    # byte stays NUL (else the kernel reads on into the environment).
    ctypes.memmove(start, title.ljust(len(line), b"\0"), len(line))


def main(argv: list[str] | None = None) -> int:
    """Run the agent until SIGTERM or SIGINT (SIGKILL as PID 1); the exit status."""
    argv = sys.argv[1:] if argv is None else argv
    if "-h" in argv or "--help" in argv:
        print(USAGE, end="")
        return 0
    try:
        args = parse_args(argv)
    except UsageError as exc:
        print(f"{USAGE}\npodbay agent: error: {exc}", file=sys.stderr)
        return 2
    try:
        declared_env = load_env_file(args.env_file) if args.env_file else {}
        listener = make_listener(args)
    except (EnvFileError, OSError) as exc:
        print(f"podbay-agent: {exc}", file=sys.stderr)
        return 2
    if os.getpid() == 1:
        # The sandbox's init: make sure its workspace exists for every command.
        try:
            os.makedirs(args.workspace, exist_ok=True)
        except OSError as exc:
            print(f"podbay-agent: cannot create {args.workspace}: {exc}", file=sys.stderr)
    else:
        become_subreaper()
    if args.oom_fd is not None:
        oom.adopt_own_score(args.oom_fd)
    if args.guard_uid is not None:
        if args.pids_max is not None:
            try:
                guestpids.confine(args.pids_max, args.guard_uid)
            except OSError as exc:
                # Commands then run unconfined: the host's budget still holds them.
                print(f"podbay-agent: no pids cgroup for commands: {exc}", file=sys.stderr)
        try:
            guard.enable(args.guard_uid)
        except OSError as exc:
            print(f"podbay-agent: cannot run as uid {args.guard_uid}: {exc}", file=sys.stderr)
            return 2
        launcher.program = args.launcher
    threading.stack_size(THREAD_STACK_BYTES)
    reaper = Reaper()
    reaper.start()
    app = App(reaper, os.path.abspath(args.workspace), declared_env)
    where = listener.getsockname() or f"fd {args.fd}"
    print(
        f"podbay-agent {VERSION}: serving on {where} (pid {os.getpid()})",
        file=sys.stderr,
        flush=True,
    )
    restore_default_dispositions()
    if os.getpid() == 1:
        # No handlers at all: the kernel then drops every signal sent to a
        # namespace's init from inside it (SIGKILL included), so no `kill 1`
        # or `pkill python` in the sandbox can take the agent down (nor ptrace
        # nor pidfd_getfd: the runtime starts us non-dumpable). The runtime
        # stops the sandbox with SIGKILL from outside, which ends everything.
        signal.signal(signal.SIGINT, signal.SIG_DFL)
    else:
        signal.signal(signal.SIGTERM, _stop)
        signal.signal(signal.SIGINT, _stop)
    try:
        hibernation = Hibernation.configure(
            listener,
            from_fd=args.fd is not None,
            may_sleep=lambda: (
                app.relayed and not app.processes.list() and alone(launcher.current_pid())
            ),
            before_sleep=lambda: launcher.retire(reaper) and alone(None),
            program=args.waiter,
        )
        if os.getpid() == 1:
            retitle()  # after configure, which reads the command line to execute on waking
        if hibernation is None:
            reopen = _reopener(args)
            server = Server(listener, app, protocol_refusal, reopen=reopen)
            if reopen is not None:
                watch = park.TcpWatch()
                watch.start()
                app.park, app.park_refusal = server.park, watch.refusal
            server.serve_forever()
        else:
            Server(
                listener,
                app,
                protocol_refusal,
                on_idle=hibernation.on_idle,
                idle_poll_seconds=hibernation.poll_seconds(),
            ).serve_forever()
    except SystemExit:
        pass
    finally:
        app.processes.kill_all()
        listener.close()
        if args.socket:
            with contextlib.suppress(OSError):
                os.unlink(args.socket)
    return 0


def _reopener(args: Options) -> Callable[[], socket.socket] | None:
    """For an agent on a socket it bound itself (gVisor's): after a park, wait
    for the host's word that the sandbox was restored, then bind it again."""
    path = args.socket
    if path is None:
        return None

    def reopen() -> socket.socket:
        park.announce_parked(path)
        park.wait_until_resumed(park.resumed_marker(path))
        return make_listener(args)

    return reopen


#: Signals a command expects at their default action when it starts.
COMMAND_SIGNALS = ("SIGHUP", "SIGINT", "SIGQUIT", "SIGTERM", "SIGUSR1", "SIGUSR2", "SIGALRM")


def restore_default_dispositions() -> None:
    """An ignored signal stays ignored across exec: whatever started the agent
    ignoring one (``nohup``, a shell with SIGQUIT ignored) would pass that on
    to every command, and ``kill -QUIT`` through the API would do nothing.
    Commands start with default dispositions, as in any fresh container."""
    for name in COMMAND_SIGNALS:
        signum = getattr(signal, name)
        if signal.getsignal(signum) == signal.SIG_IGN:
            signal.signal(signum, signal.SIG_DFL)


if __name__ == "__main__":
    sys.exit(main())
