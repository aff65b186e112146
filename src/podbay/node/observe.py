"""Per-sandbox metrics on the node: every running sandbox sampled every
:data:`~podbay.wire.observe.METRICS_INTERVAL_SECONDS`, the samples kept in
memory for :data:`WINDOW`.

The node samples what it routes (:meth:`Sampler.watch` when a sandbox's route
is published, :meth:`Sampler.unwatch` when withdrawn): a suspended or stopped
sandbox costs nothing and its past samples stay readable until they age out.
Each sample is one driver reading (:class:`podbay.runtime.usage.MeasuredDriver`);
CPU is the counter's rise over the period, so a sandbox's first sample comes
one period after its route. Samples live in the node process only: a restart
starts the window again (docs/observability.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta

from podbay.runtime.usage import Usage
from podbay.wire.observe import METRICS_INTERVAL_SECONDS, MetricSample, on_the_wire

log = logging.getLogger("podbay.node.metrics")
WINDOW = timedelta(minutes=10)

#: Reads one machine: ``(class, machine id) → usage``, None when not running.
Measure = Callable[[str, str], Awaitable[Usage | None]]


def _utcnow() -> datetime:
    return datetime.now(UTC)


class Sampler:
    def __init__(
        self,
        measure: Measure,
        *,
        interval: float = METRICS_INTERVAL_SECONDS,
        window: timedelta = WINDOW,
        clock: Callable[[], datetime] = _utcnow,
        background: bool = True,
    ) -> None:
        self.measure = measure
        #: Whether watching starts the sampling task (a test calls sample_once).
        self.background = background
        self.interval = interval
        self.window = window
        self.clock = clock
        #: sandbox id → (class, machine id) of what is sampled now.
        self._watched: dict[str, tuple[str, str]] = {}
        self._samples: dict[str, deque[MetricSample]] = {}
        #: sandbox id → (class, machine id) of every sandbox ever watched (until destroyed).
        self._machines: dict[str, tuple[str, str]] = {}
        #: sandbox id → (monotonic time, CPU seconds) of its previous reading.
        self._previous: dict[str, tuple[float, float]] = {}
        self._task: asyncio.Task[None] | None = None
        #: sandbox id → its machine's OOM kill counter at the last reading (the
        #: first sets it: kills before are not this node's to report), and the
        #: kills seen since with when the last was seen.
        self._oom_last: dict[str, int] = {}
        self._ooms: dict[str, tuple[datetime, int]] = {}

    # -- what is sampled ---------------------------------------------------------
    def watch(self, sandbox_id: str, class_: str, machine_id: str) -> None:
        self._watched[sandbox_id] = (class_, machine_id)
        self._machines[sandbox_id] = (class_, machine_id)
        if self.background and (self._task is None or self._task.done()):
            with contextlib.suppress(RuntimeError):  # no running loop: started by the next
                self._task = asyncio.get_running_loop().create_task(self._loop())

    def unwatch(self, sandbox_id: str) -> None:
        self._watched.pop(sandbox_id, None)
        self._previous.pop(sandbox_id, None)

    def oom_kills(self) -> dict[str, tuple[datetime, int]]:
        """Per sandbox: OOM kills seen since it was first sampled here, and
        when the last was seen (a running total: :class:`OomTally` diffs it)."""
        return dict(self._ooms)

    def forget_machine(self, machine_id: str) -> list[str]:
        """The machine is destroyed: its sandbox's samples go with it. Returns
        the sandbox ids it was sampled for."""
        gone = [sid for sid, (_, mid) in self._machines.items() if mid == machine_id]
        for sandbox_id in gone:
            self.unwatch(sandbox_id)
            self._samples.pop(sandbox_id, None)
            self._oom_last.pop(sandbox_id, None)
            self._ooms.pop(sandbox_id, None)
            del self._machines[sandbox_id]
        return gone

    def samples(self, sandbox_id: str, since: datetime | None = None) -> list[MetricSample]:
        """The window's samples, oldest first (only those after ``since``)."""
        ring = self._samples.get(sandbox_id, ())
        return [s for s in ring if since is None or s.at > since]

    def latest(self) -> dict[str, MetricSample]:
        """The newest sample of every sandbox sampled now (one read for the
        console's live list: a watcher asks once per period for them all)."""
        return {
            sandbox_id: ring[-1]
            for sandbox_id, ring in self._samples.items()
            if ring and sandbox_id in self._watched
        }

    # -- sampling ----------------------------------------------------------------
    async def sample_once(self) -> None:
        """One reading of every watched sandbox, side by side: a ``vm`` guest
        slow to answer delays no other sandbox's sample."""
        now = self.clock()
        watched = list(self._watched.items())
        readings = await asyncio.gather(
            *(self._timed(class_, machine_id) for _, (class_, machine_id) in watched),
            return_exceptions=True,
        )
        at = on_the_wire(self.clock())
        for (sandbox_id, _), reading in zip(watched, readings, strict=True):
            if isinstance(reading, BaseException):  # one machine's fault never stops the others
                log.warning("sandbox %s: no metrics sample: %r", sandbox_id, reading)
            elif reading[1] is not None and sandbox_id in self._watched:
                self._record(sandbox_id, reading[1], at, reading[0])
        self._age_out(now - self.window)

    async def _timed(self, class_: str, machine_id: str) -> tuple[float, Usage | None]:
        """A reading and when it was taken (CPU is a rate: a slow neighbour's
        answer must not stretch this one's period)."""
        usage = await self.measure(class_, machine_id)
        return time.monotonic(), usage

    def _record(self, sandbox_id: str, usage: Usage, at: datetime, mono: float) -> None:
        last = self._oom_last.get(sandbox_id, usage.oom_kills)
        # A counter below the last reading is a new boot's (stopped, started again).
        new = usage.oom_kills - last if usage.oom_kills >= last else usage.oom_kills
        self._oom_last[sandbox_id] = usage.oom_kills
        if new > 0:
            self._ooms[sandbox_id] = (at, self._ooms.get(sandbox_id, (at, 0))[1] + new)
        previous = self._previous.get(sandbox_id)
        self._previous[sandbox_id] = (mono, usage.cpu_seconds)
        if previous is None or mono <= previous[0]:
            return  # CPU is a rise over a period: the first reading only starts one
        cpu = max(0.0, usage.cpu_seconds - previous[1]) / (mono - previous[0]) * 100
        ring = self._samples.setdefault(sandbox_id, deque())
        ring.append(
            MetricSample(
                at=at,
                cpu_percent=round(cpu, 2),
                memory_bytes=usage.memory_bytes,
                memory_limit_bytes=usage.memory_limit_bytes,
                disk_bytes=usage.disk_bytes,
                net_rx_bytes=usage.net_rx_bytes,
                net_tx_bytes=usage.net_tx_bytes,
            )
        )

    def _age_out(self, oldest: datetime) -> None:
        for sandbox_id, ring in list(self._samples.items()):
            while ring and ring[0].at < oldest:
                ring.popleft()
            if not ring and sandbox_id not in self._watched:
                del self._samples[sandbox_id]

    async def _loop(self) -> None:
        while self._watched:
            started = time.monotonic()
            await self.sample_once()
            await asyncio.sleep(max(0.0, self.interval - (time.monotonic() - started)))

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
