"""The agent's stand-in for a line discipline that raises no signals (gVisor's),
here on the host's kernel with real processes and a real pseudo-terminal."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

from podbay.agent import ttysignals

#: Forks a child that leads a process group of its own and sleeps; waits for it.
JOB = "import os, time\nif os.fork() == 0:\n    os.setpgid(0, 0)\n    time.sleep(30)\nos.wait()"


def _group_of_child(session: subprocess.Popen[bytes]) -> int:
    """The process group of the one child of ``session``'s leader, once it has one."""
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        children = subprocess.run(
            ["ps", "-o", "pgid=", "--ppid", str(session.pid)], capture_output=True, text=True
        ).stdout.split()
        if children:
            return int(children[0])
        time.sleep(0.05)
    raise AssertionError("the session's job never started")


def test_the_foreground_group_is_the_newest_job_else_the_leaders() -> None:
    alone = subprocess.Popen(["sh", "-c", "sleep 30; :"], start_new_session=True)
    # A job in a group of its own, as an interactive shell runs one.
    job = subprocess.Popen([sys.executable, "-c", JOB], start_new_session=True)
    groups = [alone.pid, job.pid]
    try:
        assert _group_of_child(alone) == alone.pid
        assert ttysignals.foreground_group(alone.pid) == alone.pid
        groups.append(_group_of_child(job))
        assert groups[-1] != job.pid
        assert ttysignals.foreground_group(job.pid) == groups[-1]
    finally:
        for group in groups:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(group, signal.SIGKILL)
        alone.wait()
        job.wait()


def test_ctrl_c_typed_becomes_sigint_and_is_taken_out_of_the_input() -> None:
    leader, follower = os.openpty()

    def take_terminal() -> None:
        import fcntl
        import termios

        fcntl.ioctl(0, termios.TIOCSCTTY, 0)

    child = subprocess.Popen(
        ["sleep", "30"],
        stdin=follower,
        stdout=follower,
        stderr=follower,
        start_new_session=True,
        preexec_fn=take_terminal,
    )
    os.close(follower)
    try:
        left, echo, flushed = ttysignals.raise_signals(leader, child.pid, b"ab\x03cd")
        assert (left, echo, flushed) == (b"cd", b"^C", True)
        assert child.wait(10) == -signal.SIGINT
        # Plain input passes untouched, and nothing is signalled.
        assert ttysignals.raise_signals(leader, child.pid, b"plain") == (b"plain", b"", False)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        os.close(leader)
