"""Sans-I/O bookkeeping for ``run``: offsets, the whole output, the final result."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from podbay.wire.data import ProcessOutput, ProcessStatus

from ._models import RunResult


class RunAccumulator:
    """Collects poll answers of one process: next offsets, every chunk, dropped totals.

    >>> from datetime import datetime, UTC
    >>> s = ProcessStatus(process_id="p1", command=["ls"], state="running",
    ...                   started_at=datetime.now(UTC))
    >>> acc = RunAccumulator(s)
    >>> acc.add(ProcessOutput(**{**vars(s), "stdout": "a", "stdout_next": 1}))
    >>> acc.add(ProcessOutput(**{**vars(s), "state": "exited", "exit_code": 0,
    ...                          "stdout": "b", "stdout_next": 2}))
    >>> r = acc.result(timed_out=False, killed=False); (r.stdout, r.exit_code)
    ('ab', 0)
    """

    def __init__(
        self, status: ProcessStatus, on_output: Callable[[ProcessOutput], object] | None = None
    ) -> None:
        self.process_id = status.process_id
        self._last: ProcessStatus = status
        self._on_output = on_output
        self._stdout: list[str] = []
        self._stderr: list[str] = []
        self.stdout_next = 0
        self.stderr_next = 0
        self._stdout_dropped = 0
        self._stderr_dropped = 0

    @property
    def exited(self) -> bool:
        return self._last.state == "exited"

    def add(self, chunk: ProcessOutput) -> None:
        self._last = chunk
        self.stdout_next = max(self.stdout_next, chunk.stdout_next)
        self.stderr_next = max(self.stderr_next, chunk.stderr_next)
        self._stdout_dropped += chunk.stdout_dropped
        self._stderr_dropped += chunk.stderr_dropped
        if chunk.stdout:
            self._stdout.append(chunk.stdout)
        if chunk.stderr:
            self._stderr.append(chunk.stderr)
        if self._on_output is not None and (
            chunk.stdout or chunk.stderr or chunk.stdout_dropped or chunk.stderr_dropped
        ):
            self._on_output(chunk)

    def result(self, *, timed_out: bool, killed: bool) -> RunResult:
        last = self._last
        status = {f.name: getattr(last, f.name) for f in dataclasses.fields(ProcessStatus)}
        return RunResult(
            **status,
            stdout="".join(self._stdout),
            stderr="".join(self._stderr),
            stdout_next=self.stdout_next,
            stderr_next=self.stderr_next,
            stdout_dropped=self._stdout_dropped,
            stderr_dropped=self._stderr_dropped,
            timed_out=timed_out,
            killed=killed,
        )
