"""What the sync client needs from its concurrency library: threads and ``time.sleep``.

Hand-written twin of ``_async/_backend.py`` (same names).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

sleep = time.sleep
Lock = threading.Lock

#: A streamed request body.
ByteStream = Iterator[bytes]


def shielded(seconds: float) -> contextlib.nullcontext[None]:
    """Nothing cancels a thread from outside; clean-up simply runs."""
    return contextlib.nullcontext()
