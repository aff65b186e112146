"""One asyncio lock per (deployment, name): every transition of a sandbox
holds it, so an attach, a stop and a lifecycle pass never interleave on one
sandbox. Within one server this is what makes 50 racing attaches settle on
one sandbox; the store's unique (deployment, name) guards across processes.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager


class NameLocks:
    def __init__(self) -> None:
        self._locks: dict[tuple[str, str], asyncio.Lock] = {}
        self._users: dict[tuple[str, str], int] = {}
        #: Locks taken so far, of any name (see :meth:`stamp`).
        self._taken = 0

    @asynccontextmanager
    async def hold(self, deployment_id: str, name: str) -> AsyncIterator[None]:
        key = (deployment_id, name)
        lock = self._locks.setdefault(key, asyncio.Lock())
        self._users[key] = self._users.get(key, 0) + 1
        try:
            async with lock:
                self._taken += 1
                yield
        finally:
            self._users[key] -= 1
            if self._users[key] == 0:  # nobody waits: forget it, the map stays small
                del self._users[key]
                del self._locks[key]

    def busy(self, deployment_id: str, name: str) -> bool:
        return (deployment_id, name) in self._locks

    def stamp(self, deployment_id: str, name: str) -> int | None:
        """Taken just before reading a sandbox's row without its lock: None when
        its lock is held or awaited now. See :meth:`unchanged_since`."""
        return None if self.busy(deployment_id, name) else self._taken

    def unchanged_since(self, stamp: int | None) -> bool:
        """Inside :meth:`hold`: whether no lock but this one was taken since
        ``stamp``. Then no transition of this process (each holds the lock)
        touched the sandbox since the read made at ``stamp``, which is as good as
        a read made now: other processes' writes are refused by compare-and-set
        either way. Any lock taken meanwhile, of any name, says False."""
        return stamp is not None and self._taken == stamp + 1
