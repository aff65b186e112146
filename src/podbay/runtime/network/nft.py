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

__all__ = ["available", "load", "query"]

#: libnftables's NFT_CTX_OUTPUT_JSON.
_OUTPUT_JSON = 1 << 4

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
                lib.nft_ctx_output_set_flags.argtypes = [ctypes.c_void_p, ctypes.c_uint]
                lib.nft_ctx_get_output_buffer.argtypes = [ctypes.c_void_p]
                lib.nft_ctx_get_output_buffer.restype = ctypes.c_char_p
                _library = lib
            except (OSError, AttributeError):
                _library = None
        return _library


def available() -> bool:
    return _libnftables() is not None or shutil.which("nft") is not None


def load(batch: str) -> None:
    """Load ``batch`` in the calling thread's network namespace, or raise OSError."""
    _run(batch, json=False)


def query(command: str) -> str:
    """Run ``command`` (a ``list ...``) in the calling thread's network namespace
    and return its JSON output, or raise OSError (also when what it lists is not there)."""
    return _run(command, json=True)


def _run(batch: str, *, json: bool) -> str:
    lib = _libnftables()
    if lib is not None:
        ctx = lib.nft_ctx_new(0)
        if not ctx:
            raise OSError(errno.ENOMEM, "nft_ctx_new failed")
        try:
            if json:
                lib.nft_ctx_output_set_flags(ctx, _OUTPUT_JSON)
            lib.nft_ctx_buffer_output(ctx)
            lib.nft_ctx_buffer_error(ctx)
            if lib.nft_run_cmd_from_buffer(ctx, batch.encode()) != 0:
                message = (lib.nft_ctx_get_error_buffer(ctx) or b"").decode(errors="replace")
                raise OSError(errno.EINVAL, f"nft: {message.strip()}")
            return (lib.nft_ctx_get_output_buffer(ctx) or b"").decode(errors="replace")
        finally:
            lib.nft_ctx_free(ctx)
    argv = ["nft", "-j", "-f", "-"] if json else ["nft", "-f", "-"]
    done = subprocess.run(argv, input=batch.encode(), capture_output=True, check=False)
    if done.returncode != 0:
        raise OSError(errno.EINVAL, f"nft: {done.stderr.decode(errors='replace').strip()}")
    return done.stdout.decode(errors="replace")
