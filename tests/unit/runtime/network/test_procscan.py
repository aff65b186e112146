"""The one /proc stat parser: start times name a process, zombies are not alive."""

from __future__ import annotations

import os
import subprocess
import sys

from podbay.runtime.network import procscan


def test_own_process_has_a_stable_start_time() -> None:
    start = procscan.start_time(os.getpid())
    assert start is not None
    assert start.isdigit()
    assert procscan.alive(os.getpid(), start)
    assert not procscan.alive(os.getpid(), str(int(start) + 1))  # a reused pid


def test_a_command_name_with_spaces_and_parentheses() -> None:
    # PR_SET_NAME, then say so and wait for stdin to close.
    script = (
        "import sys, ctypes; ctypes.CDLL(None).prctl(15, b'a) b (c', 0, 0, 0); "
        "print(flush=True); sys.stdin.read()"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert child.stdout is not None
        child.stdout.readline()
        with open(f"/proc/{child.pid}/comm", "rb") as comm:
            assert b") b (c" in comm.read()
        found = procscan.stat(child.pid)
        assert found is not None
        assert found.state in "RS"
        assert procscan.cmdline(child.pid)[0] == sys.executable
        assert child.pid in procscan.find(lambda pid: pid == child.pid)
    finally:
        child.communicate(b"")


def test_zombies_and_missing_pids_are_not_alive() -> None:
    child = subprocess.Popen(["true"])
    os.waitid(os.P_PID, child.pid, os.WEXITED | os.WNOWAIT)  # exited, not reaped
    assert procscan.stat(child.pid) is not None
    assert not procscan.alive(child.pid)
    child.wait()
    assert procscan.stat(child.pid) is None
    assert procscan.stat(0) is None
    assert not procscan.alive(-1)
