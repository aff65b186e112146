"""How many requests of one sandbox the gateway has at its agent at once.

Each request relayed holds an agent connection, and the agent a thread, for
as long as it lasts; a client that sends half a body and stalls holds them
too. Unbounded, a few hundred such requests took every thread the sandbox
could start and every other call to it answered 502. So per sandbox:

- at most ``limit`` requests are at the agent at once; more wait their turn,
  in order, up to ``queue`` of them; one more is refused at once with 429
  ``SANDBOX_BUSY`` (and ``Retry-After``);
- of those, requests whose body streams from the client (a file write, a
  command's stdin, a request to a port) take at most half the slots, so that
  stalled uploads can never take the slots of the calls that send their
  whole body first (those are read before a slot is taken at all).

Other sandboxes are not affected: each has its own.

A WebSocket to a port in the sandbox holds its tunnel for as long as it is
open, hours perhaps, so it takes none of those slots (it would starve the
sandbox's calls) but one of ``websockets`` of its own: one more is refused
at once with 429 ``SANDBOX_BUSY``, with no queue (a WebSocket waiting behind
another that may never close would only wait).

>>> a = Admission(limit=4, queue=0)
>>> a.streams_limit
2
"""

from __future__ import annotations

import asyncio

from podbay.errors import ApiError
from podbay.wire.codes import ErrorCode
from podbay.wire.limits import DEFAULT_RETRY_AFTER_SECONDS

#: Defaults of ``server.sandbox_requests`` and ``server.sandbox_queue``.
DEFAULT_LIMIT = 64
DEFAULT_QUEUE = 256
#: Default of ``server.sandbox_websockets``.
DEFAULT_WEBSOCKETS = 32


class Admission:
    def __init__(
        self,
        limit: int = DEFAULT_LIMIT,
        queue: int = DEFAULT_QUEUE,
        websockets: int = DEFAULT_WEBSOCKETS,
    ) -> None:
        self.limit = max(1, limit)
        self.queue = max(0, queue)
        self.streams_limit = max(1, self.limit // 2)
        self._all = asyncio.Semaphore(self.limit)
        self._streams = asyncio.Semaphore(self.streams_limit)
        self.waiting = 0
        self.websockets_limit = max(1, websockets)
        #: WebSockets to the sandbox's ports open now.
        self.websockets = 0

    def open_websocket(self) -> None:
        """Take a WebSocket slot; ApiError ``SANDBOX_BUSY`` when all are taken.
        :meth:`close_websocket` gives it back.

        >>> a = Admission(websockets=1)
        >>> a.open_websocket()
        >>> try:
        ...     a.open_websocket()
        ... except ApiError as exc:
        ...     print(exc.code.value)
        SANDBOX_BUSY
        >>> a.close_websocket(); a.open_websocket()
        """
        if self.websockets >= self.websockets_limit:
            raise ApiError(
                ErrorCode.SANDBOX_BUSY,
                f"the sandbox has {self.websockets_limit} WebSockets to its ports open;"
                " close one or try again later",
                retry_after=DEFAULT_RETRY_AFTER_SECONDS,
            )
        self.websockets += 1

    def close_websocket(self) -> None:
        self.websockets -= 1

    async def acquire(self, *, streams: bool) -> None:
        """Take a slot for one request (``streams``: its body comes from the
        client while it holds it), waiting in the queue if need be; ApiError
        ``SANDBOX_BUSY`` when the queue is full. :meth:`release` gives it back."""
        if streams:
            await self._take(self._streams)
        try:
            await self._take(self._all)
        except BaseException:
            if streams:
                self._streams.release()
            raise

    def release(self, *, streams: bool) -> None:
        self._all.release()
        if streams:
            self._streams.release()

    async def _take(self, gate: asyncio.Semaphore) -> None:
        if not gate.locked():
            await gate.acquire()  # free now: does not wait
            return
        if self.waiting >= self.queue:
            raise ApiError(
                ErrorCode.SANDBOX_BUSY,
                f"the sandbox has {self.limit} requests under way and {self.waiting} waiting;"
                " try again shortly",
                retry_after=DEFAULT_RETRY_AFTER_SECONDS,
            )
        self.waiting += 1
        try:
            await gate.acquire()
        finally:
            self.waiting -= 1
