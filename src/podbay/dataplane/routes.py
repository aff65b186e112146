"""Which sandboxes the gateway may reach, and through which socket.

The control plane (or, split out, the node) adds a route when a sandbox
incarnation starts running and removes it BEFORE suspending, stopping or
destroying it, so a request either reaches a running agent or is refused
with ``SANDBOX_NOT_RUNNING`` (never hangs on a frozen one).
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field
from pathlib import Path

from .admission import DEFAULT_LIMIT, DEFAULT_QUEUE, DEFAULT_WEBSOCKETS, Admission
from .agentpool import AgentPool


@dataclass
class Route:
    sandbox_id: str
    machine_id: str
    incarnation: int
    socket: Path
    #: Kept-alive connections to this incarnation's agent.
    pool: AgentPool = field(init=False, repr=False)
    #: The first connection being opened and warmed (see :meth:`RouteTable.ready`).
    warming: asyncio.Task[None] | None = field(default=None, init=False, repr=False)
    #: How many of the sandbox's requests are at its agent at once (:mod:`.admission`).
    admission: Admission = field(default_factory=Admission, repr=False)

    def __post_init__(self) -> None:
        self.pool = AgentPool(self.socket)


class RouteTable:
    def __init__(
        self,
        *,
        requests: int = DEFAULT_LIMIT,
        queue: int = DEFAULT_QUEUE,
        websockets: int = DEFAULT_WEBSOCKETS,
    ) -> None:
        #: Each sandbox's slots at its agent, its queue and its WebSockets to
        #: its ports (:class:`.Admission`).
        self.requests = requests
        self.queue = queue
        self.websockets = websockets
        self._routes: dict[str, Route] = {}
        self._prewarming: set[asyncio.Task[None]] = set()
        #: Clear while a restarted server takes back the machines the last one
        #: left running (see :meth:`hold`); set otherwise.
        self._settled = asyncio.Event()
        self._settled.set()

    # -- a restart's adoption -------------------------------------------------------
    def hold(self) -> None:
        """Routes are being re-added after a restart: until :meth:`settle`, a
        sandbox without a route may be one not yet taken back, not one gone, so
        the gateway holds its requests instead of refusing their credentials."""
        self._settled.clear()

    def settle(self) -> None:
        """Every machine that outlived the last server was taken back (or failed to be)."""
        self._settled.set()

    @property
    def settled(self) -> bool:
        return self._settled.is_set()

    async def wait_settled(self, within: float) -> bool:
        """Wait at most ``within`` seconds for :meth:`settle`; whether it came."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(within):
                await self._settled.wait()
        return self.settled

    def get(self, sandbox_id: str) -> Route | None:
        return self._routes.get(sandbox_id)

    def add(self, sandbox_id: str, machine_id: str, incarnation: int, socket: Path) -> None:
        old = self._routes.get(sandbox_id)
        if old and (old.machine_id, old.incarnation, old.socket) == (
            machine_id,
            incarnation,
            socket,
        ):
            return
        route = self._routes[sandbox_id] = Route(
            sandbox_id,
            machine_id,
            incarnation,
            socket,
            Admission(self.requests, self.queue, self.websockets),
        )
        if old is not None:
            old.pool.close()
        self._prewarm(route)

    def _prewarm(self, route: Route) -> None:
        """Connect to the agent now, while the attach is answered, rather than on
        the sandbox's first data-plane call."""
        with contextlib.suppress(RuntimeError):  # no running loop (a synchronous caller)
            task = asyncio.get_running_loop().create_task(route.pool.prewarm())
            self._prewarming.add(task)
            task.add_done_callback(self._prewarming.discard)
            route.warming = task

    async def ready(self, sandbox_id: str) -> None:
        """Wait until the route's first connection is open and warm (or failed:
        best effort, bounded by the prewarm's own timeout)."""
        route = self._routes.get(sandbox_id)
        task = route.warming if route is not None else None
        if task is not None and not task.done():
            await asyncio.shield(task)

    def remove(self, sandbox_id: str) -> None:
        old = self._routes.pop(sandbox_id, None)
        if old is not None:
            old.pool.close()

    def __len__(self) -> int:
        return len(self._routes)

    def __contains__(self, sandbox_id: str) -> bool:
        return sandbox_id in self._routes

    async def close(self) -> None:
        routes, self._routes = self._routes, {}
        for route in routes.values():
            route.pool.close()
