"""How every command in the sandbox is started, whether by the agent
(:mod:`.launch`) or by the launcher it forked (:mod:`.launcher`): both import
this, and neither imports the other's start."""

from __future__ import annotations

import subprocess
from collections.abc import Mapping, Sequence


def popen_command(
    argv: list[str],
    streams: Sequence[int],
    cwd: str,
    env: Mapping[str, str],
    uid: int | None,
    gid: int | None,
    groups: list[int] | None,
    terminal: bool,
    close_fds: bool = True,
) -> subprocess.Popen[bytes]:
    """How every command is started, by the agent or by its launcher: leading a
    new session, with ``streams`` as its standard streams, as
    ``uid``/``gid``/``groups`` (None: the starter's own). A vfork unless ids or
    a ``terminal`` (:func:`take_terminal`) need code in the child.
    ``close_fds=False`` only where every other descriptor is close-on-exec."""
    return subprocess.Popen(
        argv,
        stdin=streams[0],
        stdout=streams[1],
        stderr=streams[2],
        cwd=cwd,
        env=env,
        start_new_session=True,
        close_fds=close_fds,
        bufsize=0,
        user=uid,
        group=gid,
        extra_groups=groups,
        preexec_fn=take_terminal if terminal else None,
    )


def take_terminal() -> None:
    """Make standard input (the pty) the new session's controlling terminal, so
    that Ctrl-C typed on it reaches the foreground process group as SIGINT."""
    import fcntl
    import termios

    fcntl.ioctl(0, termios.TIOCSCTTY, 0)
