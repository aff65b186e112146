"""An idle agent steps aside for a tiny waiter until its next connection.

An awake agent holds several times the private memory (the interpreter, its
modules, its threads) of an interpreter that has imported nothing and only
waits (figures: docs/performance.md). So once the agent has had nothing to do for
``PODBAY_AGENT_HIBERNATE_SECONDS`` (the runtime sets it; unset or 0: never)
it *hibernates*: it closes its idle connections and executes :data:`WAITER`
with the same loader and interpreter, keeping only the listening socket (under gVisor, where
the runtime passes ``--waiter``, the static program ``waiter.c`` instead:
there the sandbox's every touched page is the sentry's memory, and the
interpreter touches megabytes where that program touches kilobytes). The
first connection that comes in wakes it: the waiter executes the agent's own
command line again, and the new agent accepts that connection, which waited
in the socket's backlog meanwhile. The waiter is the same process (PID 1 of the
sandbox stays PID 1), started through the same execute-only loader (so it is as
undumpable as the agent), with no signal handlers.

Nothing has to survive the exec, because the agent only hibernates when there
is nothing to keep: no process in the sandbox but itself (it is every process's
ancestor, so "no children" means none), no request under way, every
connection idle that long (see :meth:`.http.Connections.close_if_idle`: a
request either arrives before the connections close and is answered, or its
write fails and the gateway sends it again on a new connection). The declared
environment is read again from the env file.

Only with a unix socket: handed over with ``--fd`` (what runc's sandboxes do),
or bound by path by the sandbox's PID 1 (gVisor's: the waiter then wakes the
agent with ``--fd`` in place of ``--socket``, so the connection waiting in the
backlog is kept). Under the guard (gVisor) the agent runs as its own uid and
keeps its capabilities only across set-uid calls, not across an exec; so the
hibernating thread takes root's ids back first, and the waiter and the woken
agent start as the sandbox's first process did (:func:`.guard.as_root_for_exec`);
the launcher of commands, idle by then, is ended first (:mod:`.launcher`). And
only once armed by a request the gateway relayed (it carries ``X-Request-Id``):
the runtime's own calls (readiness, the warm pool's warm-up exec) do not arm
it, so a machine waiting in a warm pool stays awake and the first exec of its
new owner stays fast. Waking costs the agent's start-up (tens of ms): that is
the price of an exec after a long pause.
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Callable

from . import guard, oom
from .http import Connections
from .protocol import HIBERNATE_ENV

#: The environment variable with the idle seconds before hibernating.
ENV = HIBERNATE_ENV

#: The waiter: ``python -c WAITER FD ARGV...`` waits until the listening socket
#: FD has a connection queued, then executes ARGV (the agent's command line).
#: Only built-in modules, so it stays at the bare interpreter's size.
WAITER = """\
import sys, posix, select, _signal
_signal.signal(_signal.SIGINT, _signal.SIG_DFL)
waiting = select.poll()
waiting.register(int(sys.argv[1]), select.POLLIN)
waiting.poll()
while True:
    try:
        posix.execv(sys.argv[2], sys.argv[2:])
    except OSError:
        waiting.poll(100)
"""


def waiter_argv(cmdline: list[str], fd: int, program: str | None = None) -> list[str] | None:
    """The waiter's command line for an agent started as ``cmdline`` (loader and
    interpreter options up to ``-c``, then the agent's program and options),
    serving the socket ``fd``; None when ``cmdline`` is not of that shape. The
    waiter is :data:`WAITER` on the agent's own interpreter, or ``program``
    (``waiter.c``: the same arguments, a fraction of the memory).

    >>> waiter_argv(["/ld.so", "/py", "-I", "-c", "main()", "--fd", "3"], 3)[:4]
    ['/ld.so', '/py', '-I', '-c']
    >>> waiter_argv(["/py", "-c", "main()", "--fd", "3"], 3, "/w")
    ['/w', '3', '/py', '-c', 'main()', '--fd', '3']
    >>> waiter_argv(["/py", "-m", "podbay.agent"], 3) is None
    True
    """
    if "-c" not in cmdline:
        return None
    start = cmdline.index("-c")
    woken = waking_argv(cmdline, start + 2, fd)
    if program is not None:
        return [program, str(fd), *woken]
    return [*cmdline[:start], "-c", WAITER, str(fd), *woken]


def waking_argv(cmdline: list[str], options: int, fd: int) -> list[str]:
    """``cmdline`` with the agent's ``--socket PATH`` (among its options, from
    index ``options`` on) replaced by ``--fd FD``: the woken agent serves the
    socket the waiter kept, with the connection that woke it, instead of
    binding the path again.

    >>> waking_argv(["/py", "-c", "main()", "--socket", "/s", "--env-file", "/e"], 3, 5)
    ['/py', '-c', 'main()', '--fd', '5', '--env-file', '/e']
    >>> waking_argv(["/py", "-c", "main()", "--fd", "3"], 3, 3)
    ['/py', '-c', 'main()', '--fd', '3']
    """
    woken = list(cmdline)
    for i in range(options, len(woken) - 1):
        if woken[i] == "--socket":
            woken[i : i + 2] = ["--fd", str(fd)]
            break
    return woken


def own_cmdline() -> list[str]:
    """This process's command line as it was executed (with the loader's options,
    which ``sys.argv`` and ``sys.orig_argv`` do not show)."""
    with open("/proc/self/cmdline", "rb") as f:
        raw = f.read()
    return [os.fsdecode(arg) for arg in raw.split(b"\0")[:-1]]


class Hibernation:
    """Decides, each time the server has been without new connections for a
    while, whether to hibernate, and does it."""

    # Keeps what it is given by name, like the control plane's services: alike
    # in shape by nature (explicit wiring), nothing shared.
    def __init__(
        self,
        seconds: float,
        listener: socket.socket,
        argv: list[str],
        may_sleep: Callable[[], bool],
        before_sleep: Callable[[], bool] = lambda: True,
    ) -> None:
        self.seconds = seconds
        self.listener = listener
        self.argv = argv
        #: True when armed and no process is left in the sandbox but the agent
        #: (and an idle launcher of commands, which ``before_sleep`` ends).
        self.may_sleep = may_sleep
        #: Called once every connection is closed, just before the exec: False
        #: when something is left that the exec would lose (then stay awake).
        self.before_sleep = before_sleep

    @classmethod
    def configure(
        cls,
        listener: socket.socket,
        from_fd: bool,
        may_sleep: Callable[[], bool],
        before_sleep: Callable[[], bool] = lambda: True,
        program: str | None = None,
    ) -> Hibernation | None:
        """The agent's hibernation as its environment asks, into the waiter
        ``program`` if given (else :data:`WAITER`); None when off.
        Only a socket handed over (``from_fd``) or the sandbox's own (the agent
        is PID 1): a socket path of another agent's would be left behind."""
        raw = os.environ.get(ENV, "")
        try:
            seconds = float(raw) if raw else 0.0
        except ValueError:
            print(f"podbay-agent: ignoring {ENV}={raw!r} (not seconds)", file=sys.stderr)
            return None
        if seconds <= 0 or listener.family != socket.AF_UNIX:
            return None
        if not from_fd and os.getpid() != 1:
            return None
        argv = waiter_argv(own_cmdline(), listener.fileno(), program)
        if argv is None:
            return None
        return cls(seconds, listener, argv, may_sleep, before_sleep)

    def poll_seconds(self) -> float:
        """How often the server asks: a tenth of the delay, between 0.1 and 1 s."""
        return min(1.0, max(0.1, self.seconds / 10))

    def on_idle(self, connections: Connections) -> None:
        if not self.may_sleep():
            return
        if not connections.close_if_idle(self.seconds):
            return
        if not self.before_sleep():
            return
        self.hibernate()

    def hibernate(self) -> None:
        """Execute the waiter (on success, this does not return)."""
        print("podbay-agent: idle, hibernating until the next connection", file=sys.stderr)
        sys.stderr.flush()
        fd = self.listener.fileno()
        os.set_inheritable(fd, True)
        oom.pass_on(True)  # the agent's command line names it again (--oom-fd)
        try:
            with guard.as_root_for_exec():
                os.execv(self.argv[0], self.argv)  # noqa: S606 - our own command line, no shell
        except OSError as exc:
            os.set_inheritable(fd, False)
            oom.pass_on(False)
            self.seconds = float("inf")  # stay awake from now on
            print(f"podbay-agent: cannot hibernate: {exc}", file=sys.stderr)


def alone(launcher_pid: int | None) -> bool:
    """True when no process is left but this one and, if given, the launcher
    ``launcher_pid``. With a launcher (PID 1 under the guard), the sandbox's
    process table says it: a command's background child may belong to the
    launcher or, orphaned, to PID 1; elsewhere, no child at all."""
    if launcher_pid is None:
        return no_children()
    if os.getpid() != 1:
        return False
    own = {"1", str(launcher_pid)}
    try:
        return all(not name.isdigit() or name in own for name in os.listdir("/proc"))
    except OSError:
        return False


def no_children() -> bool:
    """True when this process has no child at all, running or exited."""
    try:
        os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return True
    return False
