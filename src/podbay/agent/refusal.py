"""The one exception agent services raise: a contract code and a sentence.

The agent cannot import :mod:`podbay.errors` (only ``wire`` and ``agent`` are
staged into the sandbox), so it has its own. The HTTP edge turns it into
``{"error": sentence, "code": CODE}`` with the code's status.
"""

from __future__ import annotations

import errno

from podbay.wire.codes import ErrorCode


class Refusal(Exception):
    """A request the agent refuses, with the contract code that says why."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    @property
    def status(self) -> int:
        return self.code.status


#: How an ``OSError`` on a path reads as a contract code.
_PATH_ERRNO: dict[int, ErrorCode] = {
    errno.ENOENT: ErrorCode.PATH_NOT_FOUND,
    errno.EISDIR: ErrorCode.PATH_IS_DIRECTORY,
    errno.ENOTDIR: ErrorCode.PATH_NOT_DIRECTORY,
    errno.EACCES: ErrorCode.PATH_ACCESS_DENIED,
    errno.EPERM: ErrorCode.PATH_ACCESS_DENIED,
    errno.EROFS: ErrorCode.PATH_ACCESS_DENIED,
    errno.ENOTEMPTY: ErrorCode.DIRECTORY_NOT_EMPTY,
    errno.EEXIST: ErrorCode.PATH_EXISTS,
    errno.ENOSPC: ErrorCode.NO_SPACE,
    errno.EDQUOT: ErrorCode.NO_SPACE,
    errno.ENAMETOOLONG: ErrorCode.PATH_INVALID,
    errno.ELOOP: ErrorCode.PATH_INVALID,
}


def path_refusal(exc: OSError, path: str) -> Refusal:
    """Translate an ``OSError`` met on ``path`` into the matching refusal.

    >>> path_refusal(FileNotFoundError(2, "No such file or directory"), "/x").code
    <ErrorCode.PATH_NOT_FOUND: 'PATH_NOT_FOUND'>
    """
    code = _PATH_ERRNO.get(exc.errno or 0, ErrorCode.INTERNAL)
    reason = exc.strerror or str(exc)
    return Refusal(code, f"{path}: {reason}")
