"""What the async client needs from its concurrency library (anyio: asyncio or trio).

The sync twin, ``_sync/_backend.py``, offers the same names with threads and
``time.sleep``; it is written by hand, not generated.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any, TypeAlias, TypeVar

import anyio
import anyio.to_thread

from podbay.wire.data import ExecEvent

T = TypeVar("T")

sleep = anyio.sleep
# The same names as the sync face's _backend.py, on purpose: the generated
# client imports them alike from either; each face fills them its own way.
if TYPE_CHECKING:
    from websockets.asyncio.client import ClientConnection

    WebSocket: TypeAlias = ClientConnection

Lock = anyio.Lock

#: A streamed request body.
ByteStream = AsyncIterator[bytes]
#: ``stream()``'s events.
EventStream = AsyncIterator[ExecEvent]


async def run_sync(func: Callable[..., T], *args: Any) -> T:
    """Blocking work (hashing, tar) off the event loop."""
    return await anyio.to_thread.run_sync(func, *args)


def shielded(seconds: float) -> anyio.CancelScope:
    """Clean-up that must run even while the task is being cancelled, bounded in time."""
    return anyio.move_on_after(seconds, shield=True)


async def ws_connect(
    url: str, headers: dict[str, str], max_size: int, open_timeout: float
) -> WebSocket:
    """An open WebSocket (websockets' asyncio client: terminals need asyncio, not trio)."""
    from websockets.asyncio.client import connect

    return await connect(
        url,
        additional_headers=headers,
        max_size=max_size,
        open_timeout=open_timeout,
        compression=None,
    )
