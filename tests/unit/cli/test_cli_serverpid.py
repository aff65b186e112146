"""``podbay dev down --server`` stops the server ``dev up`` recorded, and only that."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from podbay.cli import serverpid

#: A process whose command line looks like ``podbay serve --data-dir DIR``.
LOOKS_LIKE_SERVE = "import sys, time; time.sleep(600)"


def spawn(*argv: str) -> subprocess.Popen[bytes]:
    """The process, once its command line is ``argv``'s (``dev up`` records a
    server that already answers; right after a fork it may still read as ours)."""
    process = subprocess.Popen([sys.executable, "-c", LOOKS_LIKE_SERVE, *argv])
    want = os.fsencode(LOOKS_LIKE_SERVE)
    for _ in range(1000):
        if want in Path(f"/proc/{process.pid}/cmdline").read_bytes().split(b"\0"):
            return process
        time.sleep(0.01)
    raise AssertionError("the spawned process never showed its command line")


def test_the_recorded_server_is_stopped_and_its_file_removed(tmp_path: Path) -> None:
    server = spawn("serve", "--data-dir", str(tmp_path))
    try:
        serverpid.record(tmp_path, server.pid)
        assert serverpid.recorded(tmp_path) == server.pid
        assert serverpid.stop(tmp_path, 30) == server.pid
        assert server.wait(5) == -15  # SIGTERM
        assert not serverpid.pid_file(tmp_path).exists()
        assert serverpid.stop(tmp_path, 30) is None
    finally:
        server.kill()
        server.wait()


@pytest.mark.parametrize("what", ["another program", "another data dir", "a reused pid"])
def test_a_pid_that_is_not_that_server_is_left_alone(tmp_path: Path, what: str) -> None:
    argv = {
        "another program": ("sleep", "600"),
        "another data dir": ("serve", "--data-dir", str(tmp_path / "other")),
        "a reused pid": ("serve", "--data-dir", str(tmp_path)),
    }[what]
    other = spawn(*argv)
    try:
        serverpid.record(tmp_path, other.pid)
        if what == "a reused pid":  # same pid and command line, another start time
            pid, started = serverpid.pid_file(tmp_path).read_text().split()
            serverpid.pid_file(tmp_path).write_text(f"{pid} {int(started) - 1}\n")
        assert serverpid.recorded(tmp_path) is None
        assert serverpid.stop(tmp_path, 30) is None
        assert other.poll() is None  # still running: never signalled
        assert not serverpid.pid_file(tmp_path).exists()  # the stale file is gone
    finally:
        other.kill()
        other.wait()


def test_no_file_is_no_server(tmp_path: Path) -> None:
    assert serverpid.recorded(tmp_path) is None
    assert serverpid.stop(tmp_path, 1) is None
