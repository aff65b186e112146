"""A bash context's cells, run by podbay's python kernel INSIDE the sandbox.

Not imported by podbay: the interpreter API sends this file's source ahead of
each bash cell (``bash_cell(code)``), and the kernel runs it. One ``bash``
process per kernel keeps the context's state (variables, functions, the
working directory) between cells; each cell is written to a file and sourced
by it (stdin /dev/null: a cell never reads the driver's lines), so a cell
with a syntax error fails alone. What bash writes goes to
the kernel's stdout and stderr as it comes (so it streams); a non-zero exit
status is the cell's error. An interrupt (the SDK's timeout) kills the bash
process group: the next cell starts a new bash in the same directory the
context started in. A cell's env vars last for that cell. Standard library only (any Python 3.8+).
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shlex
import signal
import subprocess
import sys
import threading
from typing import IO, Any


class BashExitError(Exception):
    """The cell's last command exited non-zero."""


class BashSession:
    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.process = subprocess.Popen(
            ["bash", "--noprofile", "--norc"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            bufsize=0,
        )

    def alive(self) -> bool:
        return self.process.poll() is None

    def kill(self) -> None:
        with contextlib.suppress(OSError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()

    def run(self, code: str, env: dict[str, str]) -> int:
        mark = "__podbay_" + secrets.token_hex(8)
        # Assignments before ``.`` last for that command only and are exported
        # to what it runs: the cell's own env vars.
        assignments = "".join(f"{key}={shlex.quote(value)} " for key, value in env.items())
        path = os.path.join(self.directory, f"cell-{mark}.sh")
        with open(path, "w") as out:
            out.write(code + "\n")
        script = (
            f"{assignments}. {path} < /dev/null\n__podbay_status=$?\nrm -f {path}\n"
            f"printf '\\n{mark}%d\\n' $__podbay_status\nprintf '\\n{mark}\\n' >&2\n"
        )
        assert self.process.stdin is not None
        self.process.stdin.write(script.encode())
        self.process.stdin.flush()
        status: list[int] = []
        readers = [
            threading.Thread(target=relay, args=(self.process.stdout, sys.stdout, mark, status)),
            threading.Thread(target=relay, args=(self.process.stderr, sys.stderr, mark, None)),
        ]
        for reader in readers:
            reader.daemon = True
            reader.start()
        for reader in readers:
            while reader.is_alive():  # a timed join, so SIGINT reaches this thread
                reader.join(0.1)
        if not status:
            raise BashExitError("bash exited")
        return status[0]


def relay(source: IO[bytes] | None, sink: Any, mark: str, status: list[int] | None) -> None:
    """Copy ``source`` to ``sink`` up to ``"\\n" + mark`` (then its status line)."""
    assert source is not None
    token = ("\n" + mark).encode()
    pending = b""
    while True:
        chunk = os.read(source.fileno(), 65536)
        if not chunk:
            sink.write(pending.decode(errors="replace"))
            return
        pending += chunk
        found = pending.find(token)
        if found >= 0:
            sink.write(pending[:found].decode(errors="replace"))
            rest = pending[found + len(token) :]
            while status is not None and b"\n" not in rest:
                more = os.read(source.fileno(), 64)
                if not more:
                    break
                rest += more
            if status is not None:
                status.append(int(rest.split(b"\n", 1)[0] or b"1"))
            return
        # Keep what could be the start of the mark; write the rest now (streaming).
        keep = len(token) - 1
        cut = max(0, len(pending) - keep)
        # Never split a UTF-8 character: back off to a character boundary.
        while 0 < cut < len(pending) and pending[cut] & 0xC0 == 0x80:
            cut -= 1
        if cut:
            sink.write(pending[:cut].decode(errors="replace"))
            pending = pending[cut:]


def bash_cell(code: str, env: dict[str, str] | None = None) -> None:
    for key in env or {}:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
            raise ValueError(f"{key!r} is not a shell variable name")
    session: BashSession | None = globals().get("_podbay_bash_session")
    if session is None or not session.alive():
        directory = os.path.join(os.path.dirname(os.path.abspath(sys.argv[0])), "bash-cells")
        os.makedirs(directory, mode=0o700, exist_ok=True)
        session = BashSession(directory)
        globals()["_podbay_bash_session"] = session
    try:
        status = session.run(code, env or {})
    except BaseException:
        session.kill()
        raise
    if status != 0:
        raise BashExitError(f"exit status {status}")
