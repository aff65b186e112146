"""``./run``'s set-up steps: on a terminal a step counts its seconds and ends
with how long it took; in a pipe only the step's line is written.

The script's own ``log`` and ``step`` are taken from ``run`` and driven with a
command the test controls: it waits on a FIFO the test opens only once the
terminal has shown the first second, so nothing here depends on timing.
"""

from __future__ import annotations

import os
import pty
import select
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: ``run``'s log and step functions, without running any of its set-up.
PRELUDE = f"eval \"$(sed -n '/^log()/p; /^step()/,/^}}/p' {ROOT / 'run'})\"; set -euo pipefail; "


def on_pty(script: str, until: bytes | None = None, then: Path | None = None) -> tuple[int, bytes]:
    """Run ``script`` with its stderr on a terminal; once ``until`` shows, open
    ``then`` (a FIFO the script waits on). Its exit status and what it drew."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        ["bash", "-c", PRELUDE + script],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=slave,
        close_fds=True,
    )
    os.close(slave)
    drawn = b""
    released = until is None
    give_up = time.monotonic() + 120  # a hang guard, not an assertion on speed
    try:
        while time.monotonic() < give_up:
            ready, _, _ = select.select([master], [], [], 1)
            if ready:
                try:
                    chunk = os.read(master, 4096)
                except OSError:  # the terminal's other side closed: the script ended
                    break
                if not chunk:
                    break
                drawn += chunk
            if not released and until is not None and until in drawn and then is not None:
                with then.open("w") as fifo:
                    fifo.write("go\n")
                released = True
        return proc.wait(60), drawn
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()


def test_a_step_counts_seconds_on_a_terminal(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    status, drawn = on_pty(f"step 'building a thing' cat {fifo}", b"[run]   1 s", fifo)
    assert status == 0
    text = drawn.decode()
    assert text.startswith("[run] building a thing\r\n"), text
    assert "\r[run]   1 s" in text
    assert "\r\x1b[K[run]   done in " in text
    assert text.endswith(" s\r\n")


def test_a_failing_step_says_so_and_keeps_its_status() -> None:
    status, drawn = on_pty("step 'breaking a thing' sh -c 'exit 3'")
    assert status == 3
    assert "[run]   failed after " in drawn.decode()
    assert "(exit 3)" in drawn.decode()


def test_a_pipe_gets_the_step_line_only() -> None:
    done = subprocess.run(
        ["bash", "-c", PRELUDE + "step 'building a thing' sleep 1.5"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "[run] building a thing\n")


def test_the_set_up_runs_through_step() -> None:
    # Every long set-up command of ./run is a step (each says what it does).
    text = (ROOT / "run").read_text()
    for command in ("apt_install", '"$py" -m venv', "--upgrade pip", "-e '.[server"):
        line = next(line for line in text.splitlines() if command in line)
        block = text[: text.index(line)].rsplit("\n\n", 1)[-1] + line
        assert "step " in block, command
