"""nftables through libnftables (in process, no program to start) or the ``nft`` binary.

Either way the batch applies to the *calling thread's* network namespace (a
child forked from the thread inherits it), so callers run this inside a
thread that entered the sandbox's namespace (see :mod:`.netns`).
"""

from __future__ import annotations

import ctypes
import errno
import shutil
import subprocess
import threading
from typing import Any

__all__ = ["available", "load"]

_lock = threading.Lock()
_tried = False
_library: Any = None


def _libnftables() -> Any:
    global _tried, _library
    with _lock:
        if not _tried:
            _tried = True
            try:
                lib = ctypes.CDLL("libnftables.so.1")
                lib.nft_ctx_new.restype = ctypes.c_void_p
                lib.nft_ctx_new.argtypes = [ctypes.c_uint32]
                lib.nft_ctx_free.argtypes = [ctypes.c_void_p]
                lib.nft_ctx_buffer_output.argtypes = [ctypes.c_void_p]
                lib.nft_ctx_buffer_error.argtypes = [ctypes.c_void_p]
                lib.nft_ctx_get_error_buffer.argtypes = [ctypes.c_void_p]
                lib.nft_ctx_get_error_buffer.restype = ctypes.c_char_p
                lib.nft_run_cmd_from_buffer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
                lib.nft_run_cmd_from_buffer.restype = ctypes.c_int
                _library = lib
            except (OSError, AttributeError):
                _library = None
        return _library


def available() -> bool:
    return _libnftables() is not None or shutil.which("nft") is not None


def load(batch: str) -> None:
    """Load ``batch`` in the calling thread's network namespace, or raise OSError."""
    lib = _libnftables()
    if lib is not None:
        ctx = lib.nft_ctx_new(0)
        if not ctx:
            raise OSError(errno.ENOMEM, "nft_ctx_new failed")
        try:
            lib.nft_ctx_buffer_output(ctx)
            lib.nft_ctx_buffer_error(ctx)
            if lib.nft_run_cmd_from_buffer(ctx, batch.encode()) != 0:
                message = (lib.nft_ctx_get_error_buffer(ctx) or b"").decode(errors="replace")
                raise OSError(errno.EINVAL, f"nft: {message.strip()}")
        finally:
            lib.nft_ctx_free(ctx)
        return
    done = subprocess.run(
        ["nft", "-f", "-"], input=batch.encode(), capture_output=True, check=False
    )
    if done.returncode != 0:
        raise OSError(errno.EINVAL, f"nft: {done.stderr.decode(errors='replace').strip()}")
