"""Which sandboxes the gateway may reach, and through which socket.

The control plane (or, split out, the node) adds a route when a sandbox
incarnation starts running and removes it BEFORE suspending, stopping or
destroying it, so a request either reaches a running agent or is refused
with ``SANDBOX_NOT_RUNNING`` (never hangs on a frozen one).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from pathlib import Path

import httpx


@dataclass
class Route:
    sandbox_id: str
    machine_id: str
    incarnation: int
    socket: Path
    client: httpx.AsyncClient | None = field(default=None, repr=False)

    def http(self) -> httpx.AsyncClient:
        """One pooled HTTP client per route, over the agent's unix socket."""
        if self.client is None:
            self.client = httpx.AsyncClient(
                transport=httpx.AsyncHTTPTransport(uds=str(self.socket), retries=0),
                base_url="http://agent",
                timeout=httpx.Timeout(None, connect=10.0),
                limits=httpx.Limits(max_connections=64, max_keepalive_connections=16),
            )
        return self.client


class RouteTable:
    def __init__(self) -> None:
        self._routes: dict[str, Route] = {}

    def get(self, sandbox_id: str) -> Route | None:
        return self._routes.get(sandbox_id)

    def add(self, sandbox_id: str, machine_id: str, incarnation: int, socket: Path) -> None:
        old = self._routes.get(sandbox_id)
        if old and (old.machine_id, old.incarnation, old.socket) == (machine_id, incarnation,
                                                                       socket):
            return
        self._routes[sandbox_id] = Route(sandbox_id, machine_id, incarnation, socket)
        if old is not None and old.client is not None:
            _close_later(old.client)

    def remove(self, sandbox_id: str) -> None:
        old = self._routes.pop(sandbox_id, None)
        if old is not None and old.client is not None:
            _close_later(old.client)

    def __len__(self) -> int:
        return len(self._routes)

    def __contains__(self, sandbox_id: str) -> bool:
        return sandbox_id in self._routes

    async def close(self) -> None:
        routes, self._routes = self._routes, {}
        for route in routes.values():
            if route.client is not None:
                await route.client.aclose()


_closing: set[object] = set()


def _close_later(client: httpx.AsyncClient) -> None:
    """Close an old route's client without awaiting (callers are sync)."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return
    task = loop.create_task(client.aclose())
    _closing.add(task)
    task.add_done_callback(_closing.discard)
