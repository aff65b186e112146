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

import argparse
import contextlib
import os
import signal
import socket
import stat
import sys
import threading
from types import FrameType

from podbay.wire import limits

from .app import App, protocol_refusal
from .environment import EnvFileError, load_env_file
from .http import Server
from .reaper import Reaper, become_subreaper

#: Connection and pump threads need little stack; this keeps virtual memory small.
THREAD_STACK_BYTES = 1024 * 1024


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="podbay agent", description="Run the sandbox agent (inside a sandbox).")
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--socket", metavar="PATH", help="serve on a new unix socket at PATH")
    where.add_argument("--listen", metavar="HOST:PORT", help="serve on TCP (local debugging)")
    where.add_argument("--fd", metavar="N", type=int,
                       help="serve on an inherited, already-listening socket")
    parser.add_argument("--workspace", default=limits.WORKSPACE, metavar="DIR",
                        help="default cwd and base of relative paths (default %(default)s)")
    parser.add_argument("--env-file", metavar="PATH",
                        help="JSON object of variables given to every command")
    return parser.parse_args(argv)


def make_listener(args: argparse.Namespace) -> socket.socket:
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
    with contextlib.suppress(FileNotFoundError):
        if stat.S_ISSOCK(os.lstat(path).st_mode):
            os.unlink(path)  # a stale socket from an earlier run; anything else stays
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(path)
    sock.listen(128)
    return sock


def _stop(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(0)


def main(argv: list[str] | None = None) -> int:
    """Run the agent until SIGTERM or SIGINT; the exit status."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
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
    threading.stack_size(THREAD_STACK_BYTES)
    reaper = Reaper()
    reaper.start()
    app = App(reaper, os.path.abspath(args.workspace), declared_env)
    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    try:
        Server(listener, app, protocol_refusal).serve_forever()
    except SystemExit:
        pass
    finally:
        app.processes.kill_all()
        listener.close()
        if args.socket:
            with contextlib.suppress(OSError):
                os.unlink(args.socket)
    return 0


if __name__ == "__main__":
    sys.exit(main())
