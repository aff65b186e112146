"""The pid file of the server ``podbay dev up`` starts, and stopping that server by it.

The file (``dev-serve.pid`` in the data directory) holds the pid and the
process's start time (``/proc/PID/stat`` field 22, clock ticks since boot).
A pid is only signalled when a process of that pid started at that time and
runs ``serve`` on that data directory: a pid reused by something else after
the server died is left alone. The process is held by a pidfd from the check
to the signal, so it cannot be swapped in between.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
from pathlib import Path

PID_FILE = "dev-serve.pid"


def pid_file(data_dir: Path) -> Path:
    return data_dir / PID_FILE


def _start_time(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after its last ')'.
    fields = stat.rpartition(")")[2].split()
    return fields[19] if len(fields) > 19 else None


def record(data_dir: Path, pid: int) -> None:
    """Write ``pid`` (a server just started on ``data_dir``) and its start time."""
    started = _start_time(pid)
    if started is not None:
        pid_file(data_dir).write_text(f"{pid} {started}\n")


def _is_the_server(pid: int, started: str, data_dir: Path) -> bool:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return _start_time(pid) == started and b"serve" in argv and os.fsencode(str(data_dir)) in argv


def recorded(data_dir: Path) -> int | None:
    """The pid of the server the pid file names, if it still runs; None otherwise."""
    try:
        pid_text, _, started = pid_file(data_dir).read_text().strip().partition(" ")
        pid = int(pid_text)
    except (OSError, ValueError):
        return None
    return pid if _is_the_server(pid, started, data_dir) else None


def stop(data_dir: Path, timeout_s: float) -> int | None:
    """SIGTERM the recorded server and wait for it to end; its pid, or None when
    no recorded server runs (a stale file is removed). TimeoutError when it
    outlives ``timeout_s``."""
    path = pid_file(data_dir)
    try:
        pid_text, _, started = path.read_text().strip().partition(" ")
        pid = int(pid_text)
        pidfd = os.pidfd_open(pid)
    except (OSError, ValueError):
        path.unlink(missing_ok=True)
        return None
    try:
        if not _is_the_server(pid, started, data_dir):
            path.unlink(missing_ok=True)
            return None
        signal.pidfd_send_signal(pidfd, signal.SIGTERM)
        poller = select.poll()
        poller.register(pidfd, select.POLLIN)  # readable once the process has ended
        if not poller.poll(int(timeout_s * 1000)):
            raise TimeoutError(
                f"podbay serve (pid {pid}) still runs {timeout_s:.0f} s after SIGTERM"
            )
    finally:
        os.close(pidfd)
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    return pid
