"""Every exception podbay raises, in one tree.

::

    PodbayError
    ├── ApiError(code, message)          a refusal with a contract code; raised by
    │                                     services, turned into {"error","code"} with
    │                                     the code's status at the HTTP edge
    ├── SandboxRequestError(status, message, code)   client: the server refused
    │   ├── SandboxNotEnabledError       409 SANDBOXES_NOT_CONFIGURED / SANDBOX_NOT_DECLARED
    │   └── SandboxPreparingError        still 202 after ``prepare_timeout_seconds``
    └── SandboxUnavailableError(message, cause)      client: no answer (transport)

Servers raise :class:`ApiError`; clients raise the ``Sandbox*`` classes,
which mirror the reference client's. Stdlib only (the agent imports it).
"""

from __future__ import annotations

from .wire.codes import NOT_ENABLED_CODES, ErrorCode


class PodbayError(Exception):
    """Base of everything podbay raises on purpose."""


class ApiError(PodbayError):
    """A refusal the contract names. ``status`` follows from ``code``.

    >>> ApiError(ErrorCode.SANDBOX_NOT_FOUND, "no sandbox named x").status
    404
    """

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    @property
    def status(self) -> int:
        return self.code.status

    def body(self) -> dict[str, str]:
        return {"error": self.message, "code": self.code.value}


class SandboxRequestError(PodbayError):
    """The server answered with a refusal. ``code`` is its contract code, if any."""

    def __init__(self, status: int, message: str, code: str | None = None) -> None:
        super().__init__(f"{status} {code}: {message}" if code else f"{status}: {message}")
        self.status = status
        self.message = message
        self.code = code


class SandboxNotEnabledError(SandboxRequestError):
    """The deployment has no sandboxes (no sandbox section, or none configured)."""


class SandboxPreparingError(SandboxRequestError):
    """The environment was still being prepared when the client stopped waiting."""

    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(202, message, "SANDBOX_PREPARING")
        self.retry_after = retry_after


class SandboxUnavailableError(PodbayError):
    """The server could not be reached, or the connection failed mid-request.

    Never retried by the client: the command may already have run.
    """

    def __init__(self, message: str, cause: BaseException | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.cause = cause


def request_error(status: int, message: str, code: str | None) -> SandboxRequestError:
    """The client exception for a refusal body."""
    if status == 409 and code in NOT_ENABLED_CODES:
        return SandboxNotEnabledError(status, message, code)
    return SandboxRequestError(status, message, code)


__all__ = [
    "ApiError",
    "ErrorCode",
    "PodbayError",
    "SandboxNotEnabledError",
    "SandboxPreparingError",
    "SandboxRequestError",
    "SandboxUnavailableError",
    "request_error",
]
