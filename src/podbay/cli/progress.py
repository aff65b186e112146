"""Progress bars for the long builds (the base image, environment layers),
drawn from the builders' own log records, on a terminal only.

The builders log each stage (``podbay.runtime.image``: mmdebstrap's phases,
then the image's finishing steps; ``podbay.environment``: a layer's steps).
:func:`build_progress` hangs a handler on those loggers that turns the
records into a click progress bar on stderr, and stops them from also
printing as lines (which would break the bar). On a pipe, a file, or with
``--json`` it does nothing: the records print as before. Beside the bar, the
stage being done and the seconds since the build began (a build takes
minutes, and a bar that does not move for one of them looks stuck).
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import click

if TYPE_CHECKING:
    from podbay.wire.control import Preparing

#: Base-image build stages, in order, by a text their log record contains.
IMAGE_STAGES = (
    "building base image",
    "I: downloading packages",
    "I: extracting archives",
    "I: installing essential packages",
    "I: installing remaining packages",
    "I: cleaning package lists",
    "base image: preparing the root filesystem",
    "base image: shifting ownership",
)
_LAYER_START = re.compile(r"building environment layer (\w+) \((\d+) steps\)")
_LAYER_STEP = re.compile(r"layer (\w+): ")
LOGGERS = ("podbay.runtime.image", "podbay.environment")


class BuildProgress(logging.Handler):
    """Log records of image and layer builds → one click progress bar at a time."""

    def __init__(self, stream: TextIO) -> None:
        super().__init__(logging.INFO)
        self.stream = stream
        self._lock = threading.Lock()
        self._bar: Any = None
        self._stage = 0
        self._started = 0.0
        self._doing = ""

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        with self._lock:
            if record.name.startswith("podbay.runtime.image"):
                self._image(message)
            else:
                self._layer(message)

    def _open(self, length: int, label: str) -> None:
        self._close()
        self._bar = click.progressbar(
            length=length,
            label=label,
            file=self.stream,
            show_eta=False,
            show_pos=True,
            item_show_func=lambda item: item,
        )
        self._bar.__enter__()
        self._stage = 0
        self._started = time.monotonic()
        self._doing = ""
        self._tick()

    def _tick(self) -> None:
        """Redraw with the stage and the seconds so far (each record calls it)."""
        if self._bar is not None:
            elapsed = f"{time.monotonic() - self._started:.0f} s"
            self._bar.update(0, f"{self._doing}, {elapsed}" if self._doing else elapsed)

    def _advance(self, to: int) -> None:
        if self._bar is not None and to > self._stage:
            self._bar.update(to - self._stage)
            self._stage = to

    def close_bar(self) -> None:
        """End a bar left open (the build's process went away mid-way)."""
        with self._lock:
            self._close()

    def _close(self) -> None:
        if self._bar is not None:
            self._bar.__exit__(None, None, None)
            self._bar = None

    def _image(self, message: str) -> None:
        if message.startswith("building base image"):
            self._open(len(IMAGE_STAGES), "building the sandbox base image (once)")
            return
        if " ready in " in message:
            self._advance(len(IMAGE_STAGES))
            self._close()
            return
        for index, stage in enumerate(IMAGE_STAGES):
            if stage in message:
                self._doing = stage.removeprefix("I: ").removeprefix("base image: ")
                self._advance(index)
        self._tick()

    def _layer(self, message: str) -> None:
        if start := _LAYER_START.search(message):
            self._open(int(start.group(2)) + 1, f"building environment layer {start.group(1)}")
            return
        if " ready in " in message or (" failed" in message and "retrying" not in message):
            self._advance(self._bar.length if self._bar is not None else 0)
            self._close()
            return
        if step := _LAYER_STEP.search(message):
            self._doing = message[step.end() :].split(" | ", 1)[0][:40]
            self._advance(self._stage + 1)
        self._tick()


def follow_log(path: Path, offset: int, handler: BuildProgress) -> int:
    """Feed the build records among ``podbay serve``'s JSON log lines written
    since ``offset`` to ``handler``; the offset to go on from."""
    try:
        with path.open("rb") as f:
            f.seek(offset)
            data = f.read()
    except OSError:
        return offset
    end = data.rfind(b"\n") + 1  # a line still being written waits for the next call
    for raw in data[:end].splitlines():
        try:
            row = json.loads(raw)
            name, message = str(row["logger"]), str(row["message"])
        except (ValueError, KeyError, TypeError):
            continue
        if name.startswith(LOGGERS):
            handler.emit(
                logging.makeLogRecord({"name": name, "msg": message, "levelno": logging.INFO})
            )
    return offset + end


@contextlib.contextmanager
def build_progress(enabled: bool = True, stream: TextIO | None = None) -> Iterator[None]:
    """Show build progress while the block runs, when ``stream`` (stderr) is a
    terminal and ``enabled`` (false for ``--json``)."""
    out = stream if stream is not None else sys.stderr
    if not enabled or not out.isatty():
        yield
        return
    handler = BuildProgress(out)
    loggers = [logging.getLogger(name) for name in LOGGERS]
    saved = [(lg.propagate, lg.level) for lg in loggers]
    for lg in loggers:
        lg.addHandler(handler)
        lg.propagate = False
        if lg.getEffectiveLevel() > logging.INFO:
            lg.setLevel(logging.INFO)
    try:
        yield
    finally:
        handler._close()
        for lg, (propagate, level) in zip(loggers, saved, strict=True):
            lg.removeHandler(handler)
            lg.propagate = propagate
            lg.setLevel(level)


class PreparingLines:
    """The SDK's ``on_preparing`` for the CLI: while an attach waits for the
    declared environment, one line on stderr each time its build moves on
    (step, what it does, seconds so far)."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self._last: tuple[int, str] | None = None
        self._waiting_said = False

    def __call__(self, preparing: Preparing) -> None:
        step = preparing.progress
        if step is None:  # built elsewhere, or a server that does not say
            if not self._waiting_said:
                self._write(f"sandbox {preparing.name}: waiting for its environment to be built")
                self._waiting_said = True
            return
        if (step.step, step.doing) == self._last:
            return
        self._last = (step.step, step.doing)
        self._write(
            f"sandbox {preparing.name}: building its environment: step {step.step}/{step.steps}"
            f" {step.doing} ({step.elapsed_seconds:.0f} s)"
        )

    def _write(self, line: str) -> None:
        self.stream.write(f"podbay: {line}\n")
        self.stream.flush()


def preparing_lines(as_json: bool, stream: TextIO | None = None) -> PreparingLines | None:
    """A :class:`PreparingLines` for people (stderr a terminal, no ``--json``), else None."""
    out = stream if stream is not None else sys.stderr
    return PreparingLines(out) if not as_json and out.isatty() else None
