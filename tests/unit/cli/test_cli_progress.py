"""Build progress bars: drawn from the builders' log records on a terminal,
nothing on a pipe or with --json."""

from __future__ import annotations

import io
import logging
import re

from podbay.cli.progress import build_progress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _image_build() -> None:
    log = logging.getLogger("podbay.runtime.image")
    log.info("building base image %s (Debian %s, %d packages); this runs once", "k", "b", 3)
    for line in (
        "I: downloading packages with apt...",
        "I: extracting archives...",
        "I: installing essential packages...",
        "I: cleaning package lists",
    ):
        log.info("mmdebstrap: %s", line)
    log.info("base image: shifting ownership to uid %d+", 1000000)
    log.info("base image %s ready in %.0f s", "k", 9)


def _layer_build() -> None:
    log = logging.getLogger("podbay.environment")
    log.info("building environment layer %s (%d steps)", "abcdef012345", 2)
    log.info("layer %s: %s", "abcdef012345", "apt-get install tree")
    log.info("layer %s: %s", "abcdef012345", "pip install six")
    log.info("environment layer %s ready in %.1f s", "abcdef012345", 3.0)


def test_a_terminal_gets_bars_and_no_log_lines(caplog) -> None:  # type: ignore[no-untyped-def]
    term = Terminal()
    with caplog.at_level(logging.INFO), build_progress(stream=term):
        _image_build()
        _layer_build()
    shown = term.getvalue()
    assert "building the sandbox base image (once)" in shown
    assert "8/8" in shown
    assert "3/3" in shown
    assert "building environment layer abcdef012345" in shown
    # Beside each bar: what it is doing and the seconds since the build began.
    assert re.search(r"downloading packages, \d+ s", shown)
    assert re.search(r"pip install six, \d+ s", shown)
    assert not caplog.records  # the lines did not print under the bars


def test_a_pipe_or_json_gets_the_log_lines(caplog) -> None:  # type: ignore[no-untyped-def]
    for stream, enabled in ((io.StringIO(), True), (Terminal(), False)):
        caplog.clear()
        with caplog.at_level(logging.INFO), build_progress(enabled, stream=stream):
            _image_build()
        assert stream.getvalue() == ""
        assert any("ready in" in r.getMessage() for r in caplog.records)


def test_dev_up_follows_the_serve_log(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import json

    from podbay.cli.progress import BuildProgress, follow_log

    log = tmp_path / "dev-serve.log"
    rows = [
        {"logger": "podbay.runtime.image", "message": m}
        for m in (
            "building base image k (Debian bookworm, 3 packages); this runs once",
            "mmdebstrap: I: extracting archives...",
        )
    ]
    rows.insert(1, {"logger": "uvicorn", "message": "not a build line"})
    log.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"logger": "podb')
    term = Terminal()
    bar = BuildProgress(term)
    offset = follow_log(log, 0, bar)
    assert offset == log.read_bytes().rfind(b"\n") + 1  # the partial line waits
    bar.close_bar()
    assert "building the sandbox base image (once)" in term.getvalue()
    assert "2/8" in term.getvalue()


def test_an_attach_waiting_for_a_build_prints_a_line_per_step() -> None:
    from podbay.cli.progress import preparing_lines
    from podbay.wire.control import BuildStep, Preparing

    def step(number: int, doing: str, seconds: float) -> Preparing:
        progress = BuildStep(step=number, steps=4, doing=doing, elapsed_seconds=seconds)
        return Preparing(name="t", progress=progress)

    term = Terminal()
    lines = preparing_lines(False, stream=term)
    assert lines is not None
    for answer in (
        Preparing(name="t"),
        Preparing(name="t"),
        step(2, "apt-get update", 2.2),
        step(2, "apt-get update", 4.1),  # the same step again: no new line
        step(3, "install system packages", 9.6),
    ):
        lines(answer)
    assert term.getvalue().splitlines() == [
        "podbay: sandbox t: waiting for its environment to be built",
        "podbay: sandbox t: building its environment: step 2/4 apt-get update (2 s)",
        "podbay: sandbox t: building its environment: step 3/4 install system packages (10 s)",
    ]
    # In a pipe, or with --json: no callback at all, so nothing is printed.
    assert preparing_lines(False, stream=io.StringIO()) is None
    assert preparing_lines(True, stream=Terminal()) is None
