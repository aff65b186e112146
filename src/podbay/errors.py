"""Every exception podbay raises, in one tree.

::

    PodbayError
    ├── ApiError(code, message)          a refusal with a contract code; raised by
    │                                     services, turned into {"error","code"} with
    │                                     the code's status at the HTTP edge
    ├── WireError(field, problem)        a body that does not fit its model (ValueError)
    │
    │   client (the SDK)
    ├── SandboxRequestError(status, message, code)   the server refused
    │   ├── SandboxNotEnabledError       409 SANDBOXES_NOT_CONFIGURED / SANDBOX_NOT_DECLARED
    │   └── SandboxPreparingError        still 202 after ``prepare_timeout_seconds``
    ├── SandboxUnavailableError(message, cause)      no answer (transport)
    ├── InterpreterError                 run_code's interpreter cannot start or be reached
    │
    │   control plane and operator commands
    ├── DeploymentError                  a deployment command cannot be done (ValueError)
    ├── KeyRingError                     a key operation cannot be done (LookupError)
    ├── SpecError(problems)              a ``sandbox`` section is not valid (ValueError)
    ├── PrepareFailed(step, exit_code, output)       an environment build step failed
    ├── SetupFailed(index, command, exit_code, output)  a setup command failed
    ├── AgentError(status, body)         the agent refused a host-side call
    ├── AgentUnreachable                 no answer from the agent's socket
    ├── SandboxStays(reason)             a sandbox a drain was to move stays on its node
    │
    │   runtime
    ├── DriverError                      a machine operation failed (for an operator)
    │   ├── MachineNotFound              no machine with that id
    │   ├── ParkRefused                  a gVisor agent kept its socket: no checkpoint
    │   └── NetworkError                 a sandbox's network (podbay.runtime.network)
    │       └── ConnectionCut            the name check refuses a connection (why: its message)
    │
    │   gateway
    ├── AgentAnswerInvalid               an agent's answer breaks the relay's limits
    ├── BodyTooLarge                     a client's body passed the relay's limit
    ├── ResponseAborted                  an answer cut short: the server drops the connection
    │
    │   E2B's surface (podbay.e2b)
    ├── E2BError(status, code, message)  a refusal in E2B's REST error shape
    ├── ConnectError(code, message)      a refusal in the Connect protocol's shape
    │
    │   agent (inside the sandbox)
    ├── ProtocolError(status, message)   the peer broke HTTP/1.1
    ├── Aborted                          cut a response mid-body
    ├── FrameError                       a terminal-stream frame broke the rules (ValueError)
    ├── EnvFileError                     the env file is unusable (ValueError)
    ├── LaunchFailed(reason, error, invalid)  the guard's launcher started nothing
    ├── LauncherGone                     the guard's launcher went away before it was asked
    └── UsageError                       the agent's command line is wrong (ValueError)

Servers refuse with :class:`ApiError`; clients raise the ``Sandbox*``
classes, which mirror the reference client's. Foreign errors (PyJWT,
httpx, OSError) are mapped into this tree once, at the edge that meets them.
Classes that also derive from a builtin keep it so ``except ValueError``
around parsing still works. Subclasses that belong to one component may be
defined there, but derive from a class here.

Stdlib only, and no import of :mod:`podbay.wire` at load time: the agent
imports this module with the image's bare interpreter, and
:mod:`podbay.wire.codec` imports :class:`WireError` from here.
"""

from __future__ import annotations

import json

TYPE_CHECKING = False  # importing typing slows every CLI start; mypy reads this name

if TYPE_CHECKING:
    from .wire.codes import ErrorCode


class PodbayError(Exception):
    """Base of everything podbay raises on purpose."""


class ApiError(PodbayError):
    """A refusal the contract names. ``status`` follows from ``code``.

    >>> from podbay.wire.codes import ErrorCode
    >>> ApiError(ErrorCode.SANDBOX_NOT_FOUND, "no sandbox named x").status
    404
    """

    def __init__(self, code: ErrorCode, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        #: Sent as ``Retry-After``: the refusal is temporary (a server starting).
        self.retry_after = retry_after

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


def shell_exit_code(exc: SandboxRequestError) -> int | None:
    """The exit code a shell gives a command that could not start: 127 when it
    (the program) does not exist, 126 when it may not be run or its cwd not
    used; None for any other refusal. A ``COMMAND_START_FAILED``'s message
    carries the OS's reason (``cannot start 'x': No such file or directory``).

    >>> shell_exit_code(SandboxRequestError(400, "cannot start 'x': No such file or directory",
    ...                                     "COMMAND_START_FAILED"))
    127
    """
    if exc.code != "COMMAND_START_FAILED":
        return None
    missing = "No such file" in exc.message and not exc.message.startswith("cannot use cwd")
    return 127 if missing else 126


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


class InterpreterError(PodbayError):
    """The sandbox's code interpreter could not be started or reached (an
    exception in the code itself is a result, ``Execution.error``)."""


class WireError(PodbayError, ValueError):
    """A body that does not fit its model; ``field`` locates the fault."""

    def __init__(self, field: str, problem: str) -> None:
        self.field = field
        self.problem = problem
        super().__init__(f"{field}: {problem}" if field else problem)


class DeploymentError(PodbayError, ValueError):
    """A deployment command cannot be done (bad spec, name taken, unknown name)."""


class KeyRingError(PodbayError, LookupError):
    """A key operation an operator asked for cannot be done."""


class SpecError(PodbayError, ValueError):
    """The section is not valid; ``problems`` lists ``(field, message)`` pairs."""

    def __init__(self, problems: list[tuple[str, str]]) -> None:
        self.problems = problems
        super().__init__("; ".join(f"{where}: {what}" for where, what in problems))


class PrepareFailed(PodbayError):
    """A build step failed; ``step`` names it and ``output`` ends with its last lines."""

    def __init__(self, step: str, exit_code: int, output: str) -> None:
        self.step = step
        self.exit_code = exit_code
        self.output = output
        super().__init__(f"step '{step}' failed with exit code {exit_code}:\n{output}")


class SetupFailed(PodbayError):
    """A setup command failed in a fresh sandbox."""

    def __init__(self, index: int, command: str, exit_code: int, output: str) -> None:
        self.index = index
        self.command = command
        self.exit_code = exit_code
        self.output = output
        super().__init__(f"setup[{index}] `{command}` failed with exit code {exit_code}:\n{output}")


class AgentError(PodbayError):
    """The agent answered with an error status (``status``, ``body``)."""

    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"agent answered {status}: {body}")
        self.status = status
        self.body = body


class AgentUnreachable(PodbayError):
    """No answer from an agent's socket (not listening, gone, or too slow)."""


class SandboxStays(PodbayError):
    """Why a sandbox that ``podbay node drain`` was to move is on its node still."""


class DriverError(PodbayError):
    """A machine operation failed; ``message`` is meant for an operator."""


class MachineNotFound(DriverError):
    """No machine with that id exists (it was never created, or was destroyed)."""


class ParkRefused(DriverError):
    """A gVisor sandbox's agent did not take the park a checkpoint needs (it
    refused, or could not be asked): it serves on as before, and the sandbox
    is frozen in memory instead."""


class NetworkError(DriverError):
    """Setting up, adopting or tearing down a sandbox's network failed."""


class ConnectionCut(NetworkError):
    """The name check refuses a sandbox's connection; the message says why
    (logged, never shown to the sandbox, which sees a reset)."""


class AgentAnswerInvalid(PodbayError):
    """The agent's answer breaks the relay's limits: it is not relayed."""


class BodyTooLarge(PodbayError):
    """The client's body passed the relay's limit while it streamed."""


class ResponseAborted(PodbayError):
    """Raised out of the app, where the server offers no way to drop the
    connection (``podbay.asgi.RESPONSE_ABORT``), so that the server drops it
    rather than end the answer as if it were whole."""


class E2BError(PodbayError):
    """A refusal on E2B's REST surface: ``status`` and an UPPER_SNAKE ``code``,
    answered as E2B's ``{"code": status, "message"}`` body; with
    ``retry_after`` (seconds), one the SDK asks again for by itself."""

    def __init__(
        self, status: int, code: str, message: str, retry_after: int | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.retry_after = retry_after


class ConnectError(PodbayError):
    """A refusal on envd's Connect surface; ``code`` is one of Connect's
    lower-case codes (``invalid_argument``, ``not_found``, ...)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    def json(self) -> dict[str, str]:
        return {"code": self.code, "message": self.message}


class ProtocolError(PodbayError):
    """The peer broke HTTP/1.1; answered with ``status`` and the connection closed."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class Aborted(PodbayError):
    """Raised by a response body iterator to cut the connection mid-body.

    The client then sees a short body instead of bytes that would not match
    what the headers promised (used when a file changes while it is sent).
    """


class FrameError(PodbayError, ValueError):
    """A terminal-stream frame that breaks :mod:`podbay.wire.stream`'s rules."""


class EnvFileError(PodbayError, ValueError):
    """The env file is unreadable or not a JSON object of strings."""


class LaunchFailed(PodbayError):
    """Nothing ran: ``error`` is the OSError the spawn raised, else the reason;
    ``invalid``: the request was at fault (an environment the OS cannot take)."""

    def __init__(self, reason: str, error: OSError | None = None, invalid: bool = False) -> None:
        super().__init__(reason)
        self.error = error
        self.invalid = invalid


class LauncherGone(PodbayError):
    """The guard's launcher went away before it was asked: asking another is safe."""


class UsageError(PodbayError, ValueError):
    """The agent's command line does not fit its usage."""


def request_error(status: int, message: str, code: str | None) -> SandboxRequestError:
    """The client exception for a refusal body."""
    from .wire.codes import NOT_ENABLED_CODES  # not at the top: podbay.wire imports this module

    if status == 409 and code in NOT_ENABLED_CODES:
        return SandboxNotEnabledError(status, message, code)
    return SandboxRequestError(status, message, code)


def refusal_error(status: int, raw: bytes, reason: str = "") -> SandboxRequestError:
    """The client exception for a refusal answer: its body's ``error`` and
    ``code`` when it is the contract's JSON, else the start of its text.

    >>> str(refusal_error(404, b'{"error": "no sandbox x", "code": "SANDBOX_NOT_FOUND"}'))
    '404 SANDBOX_NOT_FOUND: no sandbox x'
    """
    message, code = "", None
    try:
        body = json.loads(raw)
    except ValueError:
        body = None
    if isinstance(body, dict):
        if isinstance(body.get("error"), str):
            message = body["error"]
        if isinstance(body.get("code"), str):
            code = body["code"]
    if not message:
        message = raw.decode(errors="replace").strip()[:500] or reason or "request refused"
    return request_error(status, message, code)


__all__ = [
    "Aborted",
    "AgentAnswerInvalid",
    "AgentError",
    "AgentUnreachable",
    "ApiError",
    "BodyTooLarge",
    "DeploymentError",
    "DriverError",
    "EnvFileError",
    "KeyRingError",
    "MachineNotFound",
    "NetworkError",
    "ParkRefused",
    "PodbayError",
    "PrepareFailed",
    "ProtocolError",
    "SandboxNotEnabledError",
    "SandboxPreparingError",
    "SandboxRequestError",
    "SandboxUnavailableError",
    "SetupFailed",
    "SpecError",
    "UsageError",
    "WireError",
    "refusal_error",
    "request_error",
]
