"""The local side of ``podbay sandbox shell``: this terminal, wired to one in the sandbox.

The local terminal goes into raw mode (every key, Ctrl-C included, is sent
as typed; the sandbox's terminal does the line editing and the signals) and
is restored however the session ends. Its size is sent at the start and
again on every ``SIGWINCH``. Output is written as it arrives, from a reader
thread; the main thread reads the keyboard. Without a local terminal
(standard input a pipe) the input is passed through as it is, without raw
mode or resizes.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from podbay.client import Terminal

READ_SIZE = 64 * 1024
#: What ``podbay sandbox shell NAME`` starts without a command.
DEFAULT_SHELL = ["/bin/bash", "-l"]


def local_size(fd: int) -> tuple[int, int]:
    """Rows and columns of the terminal on ``fd`` (24x80 when it has none)."""
    try:
        size = os.get_terminal_size(fd)
    except OSError:
        return 24, 80
    return max(1, size.lines), max(1, size.columns)


@contextlib.contextmanager
def raw_mode(fd: int) -> Iterator[None]:
    """``fd``'s terminal in raw mode for the block, restored after (if a terminal)."""
    if not os.isatty(fd):
        yield
        return
    import termios
    import tty

    saved = termios.tcgetattr(fd)
    try:
        tty.setraw(fd)
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def drive(terminal: Terminal, stdin: int, stdout: int) -> int:
    """Relay until the command exits; its exit code."""
    done = threading.Event()
    failure: list[BaseException] = []

    def pump_output() -> None:
        try:
            while data := terminal.recv():
                os.write(stdout, data)
        except BaseException as exc:  # noqa: BLE001 - raised after the terminal is restored
            failure.append(exc)
        finally:
            done.set()

    wake_read, wake_write = os.pipe()
    resized = threading.Event()
    previous = None
    if os.isatty(stdin):

        def on_winch(signum: int, frame: object) -> None:
            resized.set()
            os.write(wake_write, b"w")

        previous = signal.signal(signal.SIGWINCH, on_winch)
    reader = threading.Thread(target=pump_output, name="terminal-output", daemon=True)
    reader.start()
    input_open = True
    try:
        while not done.is_set():
            watched = [wake_read] + ([stdin] if input_open else [])
            ready, _, _ = select.select(watched, [], [], 0.1)
            if wake_read in ready:
                os.read(wake_read, 64)
            if resized.is_set():
                resized.clear()
                terminal.resize(*local_size(stdin))
            if stdin in ready:
                data = os.read(stdin, READ_SIZE)
                if data:
                    terminal.send(data)
                else:
                    input_open = False  # a pipe ended: wait for the command
    finally:
        if previous is not None:
            signal.signal(signal.SIGWINCH, previous)
        os.close(wake_read)
        os.close(wake_write)
    reader.join(5)
    if failure:
        raise failure[0]
    assert terminal.exit_code is not None
    return terminal.exit_code
