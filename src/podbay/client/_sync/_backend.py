"""What the sync client needs from its concurrency library: threads and ``time.sleep``.

Hand-written twin of ``_async/_backend.py`` (same names).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeAlias, TypeVar

from podbay.wire.data import ExecEvent

T = TypeVar("T")

sleep = time.sleep
# The same names as the async face's _backend.py, on purpose: the generated
# client imports them alike from either; each face fills them its own way.
if TYPE_CHECKING:
    from websockets.sync.client import ClientConnection

    WebSocket: TypeAlias = ClientConnection

Lock = threading.Lock

#: A streamed request body.
ByteStream = Iterator[bytes]
#: ``stream()``'s events.
EventStream = Iterator[ExecEvent]


def run_sync(func: Callable[..., T], *args: Any) -> T:
    """Blocking work runs where it is: the caller's thread."""
    return func(*args)


def shielded(seconds: float) -> contextlib.nullcontext[None]:
    """Nothing cancels a thread from outside; clean-up simply runs."""
    return contextlib.nullcontext()


def ws_connect(url: str, headers: dict[str, str], max_size: int, open_timeout: float) -> WebSocket:
    """An open WebSocket (websockets' threaded client)."""
    from websockets.sync.client import connect

    options: dict[str, Any] = {
        "additional_headers": headers,
        "max_size": max_size,
        "open_timeout": open_timeout,
        "compression": None,
    }
    try:
        # websockets 17 asks for legacy=True to hold a connection outside a
        # with-block (a Terminal does); older releases have no such parameter.
        return connect(url, legacy=True, **options)
    except TypeError:
        return connect(url, **options)
