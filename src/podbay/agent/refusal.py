"""How the agent's services refuse: :class:`podbay.errors.ApiError` with a
contract code (``errors.py`` is stdlib-only and staged with the agent), and
how an ``OSError`` met on a path reads as one of those codes.
"""

from __future__ import annotations

import errno

from podbay.errors import ApiError
from podbay.wire.codes import ErrorCode

#: How an ``OSError`` on a path reads as a contract code.
_PATH_ERRNO: dict[int, ErrorCode] = {
    errno.ENOENT: ErrorCode.PATH_NOT_FOUND,
    errno.EISDIR: ErrorCode.PATH_IS_DIRECTORY,
    errno.ENOTDIR: ErrorCode.PATH_NOT_DIRECTORY,
    errno.EACCES: ErrorCode.PATH_ACCESS_DENIED,
    errno.EPERM: ErrorCode.PATH_ACCESS_DENIED,
    errno.EROFS: ErrorCode.PATH_ACCESS_DENIED,
    # A mount point (/etc/hosts, /dev/null) cannot be replaced, a running
    # binary cannot be rewritten, a rename cannot cross file systems.
    errno.EBUSY: ErrorCode.PATH_ACCESS_DENIED,
    errno.ETXTBSY: ErrorCode.PATH_ACCESS_DENIED,
    errno.EXDEV: ErrorCode.PATH_ACCESS_DENIED,
    errno.EINVAL: ErrorCode.PATH_INVALID,
    errno.ENOTEMPTY: ErrorCode.DIRECTORY_NOT_EMPTY,
    errno.EEXIST: ErrorCode.PATH_EXISTS,
    errno.ENOSPC: ErrorCode.NO_SPACE,
    errno.EDQUOT: ErrorCode.NO_SPACE,
    errno.ENAMETOOLONG: ErrorCode.PATH_INVALID,
    errno.ELOOP: ErrorCode.PATH_INVALID,
    # Not a file to open: a unix socket or a device with nothing behind it
    # (``/dev/tty`` with no controlling terminal, ``/proc/self/fd/N`` of a socket).
    errno.ENXIO: ErrorCode.PATH_INVALID,
    errno.ENODEV: ErrorCode.PATH_INVALID,
    errno.EOPNOTSUPP: ErrorCode.PATH_INVALID,
}


def read_refusal(exc: OSError, path: str) -> ApiError:
    """Like :func:`path_refusal`, for an error met reading a file that opened:
    one that looks regular but reads as no file does (``/proc/self/mem``,
    EIO at offset 0; some ``/proc`` and ``/sys`` files, EINVAL or EPERM) is
    the caller's to fix, 400 ``PATH_INVALID``."""
    if exc.errno in _PATH_ERRNO:
        return path_refusal(exc, path)
    reason = exc.strerror or str(exc)
    return ApiError(ErrorCode.PATH_INVALID, f"{path} cannot be read as a file: {reason}")


def path_refusal(exc: OSError, path: str) -> ApiError:
    """Translate an ``OSError`` met on ``path`` into the matching refusal.

    >>> path_refusal(FileNotFoundError(2, "No such file or directory"), "/x").code
    <ErrorCode.PATH_NOT_FOUND: 'PATH_NOT_FOUND'>
    """
    code = _PATH_ERRNO.get(exc.errno or 0, ErrorCode.INTERNAL)
    reason = exc.strerror or str(exc)
    return ApiError(code, f"{path}: {reason}")
