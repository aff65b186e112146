"""Terminal signals where the kernel raises none: gVisor (2022).

gVisor's line discipline passes Ctrl-C, Ctrl-\\ and Ctrl-Z through as input
bytes and signals no one, and it tells only a process of the terminal's own
session which process group is in the foreground (``TIOCGPGRP`` on the
leader side is ENOTTY there, and its ``/proc/<pid>/stat`` shows no ``tpgid``).
So under the guard (gVisor) the agent does the line discipline's part
itself: when the terminal has ``ISIG`` on, each of its ``VINTR``, ``VQUIT``
and ``VSUSP`` characters in the input is taken out and becomes ``SIGINT``,
``SIGQUIT`` or ``SIGTSTP`` to the foreground group as the agent can tell it
(:func:`foreground_group`), with the input not yet read flushed and the
character echoed as ``^C`` when ``ECHO`` and ``ECHOCTL`` are on, as Linux does.
"""

from __future__ import annotations

import contextlib
import os
import signal


def foreground_group(session: int) -> int:
    """The terminal's foreground process group, as far as ``/proc`` tells it:
    the newest group of ``session`` other than its leader's (a job-control
    shell puts each job it runs in a group of its own), else the leader's (a
    program run alone, or a shell at its prompt). A shell at its prompt with a
    job in the background is the case this gets wrong: the job is signalled."""
    newest: tuple[int, int] | None = None  # (start time, group)
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone meanwhile
        # After the name: state, ppid, pgrp, session, ..., starttime (the 20th).
        group, sid, started = int(fields[2]), int(fields[3]), int(fields[19])
        if sid == session and group != session and (newest is None or started > newest[0]):
            newest = (started, group)
    return session if newest is None else newest[1]


def raise_signals(leader: int, session: int, data: bytes) -> tuple[bytes, bytes, bool]:
    """Act on the signal characters in ``data``, input for the terminal whose
    leader side is ``leader`` and whose session is ``session``: returns the
    input left to write, what to echo, and whether to drop the input written
    before (a signal flushes it unless ``NOFLSH``)."""
    import termios  # with the first terminal, as pty.set_size

    try:
        attrs = termios.tcgetattr(leader)
    except termios.error:
        return data, b"", False
    lflag, cc = attrs[3], attrs[6]
    if not lflag & termios.ISIG:
        return data, b"", False
    which = {
        cc[index]: number
        for index, number in (
            (termios.VINTR, signal.SIGINT),
            (termios.VQUIT, signal.SIGQUIT),
            (termios.VSUSP, signal.SIGTSTP),
        )
        if isinstance(cc[index], bytes) and cc[index] != b"\0"
    }
    if not any(bytes([byte]) in which for byte in data):
        return data, b"", False
    kept, echo, flushed = bytearray(), bytearray(), False
    for byte in data:
        number = which.get(bytes([byte]))
        if number is None:
            kept.append(byte)
            continue
        with contextlib.suppress(OSError):  # the group just ended
            os.killpg(foreground_group(session), number)
        if not lflag & termios.NOFLSH:
            kept.clear()
            flushed = True
        if lflag & termios.ECHO and lflag & termios.ECHOCTL:
            echo += b"^" + bytes([byte ^ 0x40])
    return bytes(kept), bytes(echo), flushed
