"""What the sync client needs from its concurrency library: threads and ``time.sleep``.

Hand-written twin of ``_async/_backend.py`` (same names).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

T = TypeVar("T")

sleep = time.sleep
Lock = threading.Lock

#: A streamed request body.
ByteStream = Iterator[bytes]


def run_sync(func: Callable[..., T], *args: Any) -> T:
    """Blocking work runs where it is: the caller's thread."""
    return func(*args)


def shielded(seconds: float) -> contextlib.nullcontext[None]:
    """Nothing cancels a thread from outside; clean-up simply runs."""
    return contextlib.nullcontext()
