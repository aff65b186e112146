"""A few ready machines per environment, so a new sandbox need not boot one.

A pooled machine is created and started with pool labels; an attach takes
one and :meth:`Driver.assign` gives it the sandbox's hostname and labels.
Pool membership lives only here, in memory: on restart the reconciler
destroys machines still labelled as pooled (no store row names them) and
the pool refills. Their memory counts like any running sandbox's.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Callable

from podbay.dataplane.agentpool import exchange
from podbay.dataplane.environment_seam import Prepared
from podbay.dataplane.nodeapi import POOL_LABEL
from podbay.domain.sandbox import new_machine_id
from podbay.runtime.base import Driver, Limits, MachineSpec
from podbay.wire import codec
from podbay.wire.data import ExecRequest
from podbay.wire.paths import EXEC

log = logging.getLogger("podbay.pool")
#: A refill waits this long after a machine is handed out, so that starting
#: its replacement (a CPU burst on a small host, much of it in this process's
#: event loop) does not slow the hand-out itself and the new owner's first calls.
REFILL_DELAY_SECONDS = 0.25
#: Bound on the warm-up of a new pooled machine (all its execs).
WARM_UP_TIMEOUT_SECONDS = 10.0
#: How many commands a new pooled machine runs before anyone gets it. One is
#: not enough: the agent's interpreter (CPython 3.11 in the base image)
#: specializes a function's bytecode only after it ran several times, and
#: measured (agent CPU per exec), an owner's first exec after one warm-up
#: exec still cost more than its second, and both more than an exec on a
#: sandbox that has run many; after ten, none of that is left.
WARM_UP_EXECS = 10
_WARM_UP_BODY = codec.dumps(ExecRequest(command=["true"], timeout_ms=5_000))
#: The warm-up exec as sent: no request id, so it does not arm the agent's
#: hibernation (only a relayed request does: a pooled machine stays awake).
_WARM_UP_REQUEST = (
    f"POST {EXEC} HTTP/1.1\r\nhost: agent\r\ncontent-type: application/json\r\n"
    f"content-length: {len(_WARM_UP_BODY)}\r\n\r\n"
).encode() + _WARM_UP_BODY


class WarmPool:
    """``size`` ready machines for each of the ``max_keys`` environments used
    most recently (the plain base image always among them); an environment
    pushed out has its machines destroyed."""

    # Collaborators come in built (the composition root wires them), so a test
    # hands in fakes and no service builds another behind the caller's back.
    def __init__(
        self,
        driver: Driver,
        limits: Limits,
        size: int,
        on_change: Callable[[int], None] | None = None,
        max_keys: int = 4,
        shortfall: Callable[[], str | None] | None = None,
    ) -> None:
        self.driver = driver
        #: Why no machine may be made now (the host's disk reserve), or None.
        self.shortfall = shortfall
        self.limits = limits
        self.size = size
        self.max_keys = max_keys
        #: key → ready machine ids; insertion order is recency (oldest first).
        self._ready: dict[str, list[str]] = {}
        self._filling: dict[str, asyncio.Task[None]] = {}
        self._destroying: set[asyncio.Task[None]] = set()
        self._closed = False
        self._on_change = on_change
        #: How long after a hand-out no machine is started (:data:`REFILL_DELAY_SECONDS`).
        self.refill_delay = REFILL_DELAY_SECONDS
        #: When the last machine was handed out (monotonic seconds).
        self._taken_at = -math.inf

    def __len__(self) -> int:
        return sum(len(v) for v in self._ready.values())

    def _changed(self) -> None:
        if self._on_change is not None:
            self._on_change(len(self))

    def take(self, prepared: Prepared) -> str | None:
        """A ready machine for this environment, or ``None``; refills behind."""
        if self.size <= 0 or self._closed:
            return None
        ready = self._ready.pop(prepared.key, [])
        machine_id = ready.pop(0) if ready else None
        self._taken_at = time.monotonic()
        self._ready[prepared.key] = ready  # most recently used now
        self._evict()
        self._changed()
        self.refill(prepared)
        return machine_id

    def _evict(self) -> None:
        while len(self._ready) > self.max_keys:
            key = next(k for k in self._ready if k != "")
            task = self._filling.pop(key, None)
            if task is not None:
                task.cancel()
            for machine_id in self._ready.pop(key):
                self._destroy_later(machine_id)

    def _destroy_later(self, machine_id: str) -> None:
        async def destroy() -> None:
            try:
                await self.driver.destroy(machine_id)
            except Exception:
                log.exception("warm pool: could not destroy %s", machine_id)

        task = asyncio.get_running_loop().create_task(destroy())
        self._destroying.add(task)
        task.add_done_callback(self._destroying.discard)

    def give_back(self, prepared: Prepared, machine_id: str) -> None:
        self._ready.setdefault(prepared.key, []).insert(0, machine_id)
        self._changed()

    def refill(self, prepared: Prepared, delay: float | None = None) -> None:
        if self.size <= 0 or self._closed:
            return
        task = self._filling.get(prepared.key)
        if task is None or task.done():
            self._filling[prepared.key] = asyncio.get_running_loop().create_task(
                self._fill(prepared, self.refill_delay if delay is None else delay)
            )

    async def _fill(self, prepared: Prepared, delay: float = 0.0) -> None:
        if delay > 0:
            await asyncio.sleep(delay)
        ready = self._ready.setdefault(prepared.key, [])
        failures = 0
        while len(ready) < self.size and not self._closed and failures < 3:
            # Also between the machines of one refill: a hand-out made while the
            # refill ran (takes closer together than a machine's start) gets
            # the same quiet moment as the first one.
            quiet = self._taken_at + self.refill_delay - time.monotonic()
            if quiet > 0:
                await asyncio.sleep(quiet)
                continue
            short = self.shortfall() if self.shortfall is not None else None
            if short is not None:
                log.warning("warm pool: not filling: %s", short)
                return
            machine_id = new_machine_id()
            spec = MachineSpec(
                machine_id=machine_id,
                hostname="sandbox",
                limits=self.limits,
                env=dict(prepared.env),
                layers=prepared.layers,
                labels={POOL_LABEL: prepared.key or "plain"},
                named_later=True,
            )
            try:
                await self.driver.create(spec)
                await self.driver.start(machine_id)
                await self._warm_up(machine_id)
            except asyncio.CancelledError:
                self._destroy_later(machine_id)  # evicted or closing mid-start
                raise
            except Exception:
                failures += 1
                log.exception("warm pool: could not start a machine")
                try:
                    await self.driver.destroy(machine_id)
                except Exception:
                    log.exception("warm pool: could not destroy %s", machine_id)
                await asyncio.sleep(1.0 * failures)
                continue
            if self._closed or self._ready.get(prepared.key) is not ready:
                await self.driver.destroy(machine_id)  # closed or evicted meanwhile
                return
            ready.append(machine_id)
            self._changed()

    async def _warm_up(self, machine_id: str) -> None:
        """Run :data:`WARM_UP_EXECS` commands in the new machine before anyone gets it.

        A fresh agent's first execs cost more than its later ones (its first
        fork, lazily bound libraries, cold caches, bytecode not yet
        specialized); paying that here makes the owner's first exec as fast
        as any other. On one kept-alive connection, from the event loop
        (cheap for this process): not AgentClient, which
        makes a connection per call and runs in a thread. Best effort: a
        machine whose warm-up fails is handed out as it is.
        """
        socket = self.driver.agent_socket(machine_id)
        try:
            async with asyncio.timeout(WARM_UP_TIMEOUT_SECONDS):
                conn = await asyncio.open_unix_connection(str(socket))
                try:
                    for _ in range(WARM_UP_EXECS):
                        await exchange(conn, _WARM_UP_REQUEST)
                finally:
                    conn[1].close()
        except (OSError, TimeoutError, EOFError, ValueError, asyncio.LimitOverrunError) as exc:
            # The agent unreachable, slow, closing or answering something else.
            log.debug("warm pool: warm-up of %s failed: %s", machine_id, exc)

    async def wait_filled(self) -> None:
        for task in list(self._filling.values()):
            await asyncio.gather(task, return_exceptions=True)

    async def close(self, *, destroy: bool = True) -> None:
        """Stop filling; destroy ready machines (they hold memory, nothing else)."""
        self._closed = True
        for task in self._filling.values():
            task.cancel()
        await asyncio.gather(*self._filling.values(), return_exceptions=True)
        await asyncio.gather(*self._destroying, return_exceptions=True)
        if destroy:
            for ids in self._ready.values():
                for machine_id in ids:
                    try:
                        await self.driver.destroy(machine_id)
                    except Exception:
                        log.exception("warm pool: could not destroy %s", machine_id)
        self._ready.clear()
        self._changed()
