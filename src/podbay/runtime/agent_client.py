"""Talk to a machine's agent from the host, synchronously: ``info`` and ``exec``.

For the runtime's own checks (``podbay doctor``, the conformance and
isolation suites, the benchmark), environment builds and the warm pool's
warm-up, not for serving users: the gateway relays those. The standard
library's ``http.client`` over the unix socket :meth:`Driver.agent_socket`
returns, bodies through :mod:`podbay.wire.codec`. Not httpx: a client and
transport built per call (an SSL context among them) cost several times the
CPU of ``http.client`` per exec (figures: docs/performance.md).

>>> AgentClient(Path("/nonexistent.sock")).socket_path.name
'nonexistent.sock'
"""

from __future__ import annotations

import http.client
import socket
from pathlib import Path
from typing import TypeVar

from podbay.errors import AgentError as AgentError  # re-exported: defined in the one tree
from podbay.errors import AgentUnreachable, WireError
from podbay.wire import codec
from podbay.wire.control import ErrorBody
from podbay.wire.data import AgentInfo, AgentStats, ExecRequest, ExecResult
from podbay.wire.observe import CommandList
from podbay.wire.paths import COMMANDS, EXEC, INFO, STATS

T = TypeVar("T")
#: Largest answer read from an agent: an exec result (1 MiB per stream, JSON
#: escaping at most 6x) fits. Code in the sandbox may answer in the agent's
#: place (a setup command, during a build), so nothing more is read.
MAX_ANSWER_BYTES = 16 * 1024 * 1024


class AgentClient:
    """One connection per call: these are occasional calls, and nothing is
    left open on an agent that the caller may destroy next."""

    def __init__(self, socket_path: Path, *, timeout: float = 120.0) -> None:
        self.socket_path = socket_path
        self.timeout = timeout

    def info(self) -> AgentInfo:
        return self._call("GET", INFO, None, AgentInfo, timeout=10)

    def commands(self) -> CommandList:
        return self._call("GET", COMMANDS, None, CommandList, timeout=self.timeout)

    def stats(self) -> AgentStats:
        return self._call("GET", STATS, None, AgentStats, timeout=self.timeout)

    def exec(
        self,
        command: list[str],
        *,
        timeout_ms: int = 60_000,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        user: str | None = None,
    ) -> ExecResult:
        body = ExecRequest(
            command=command, cwd=cwd, env=env or None, timeout_ms=timeout_ms, user=user
        )
        return self._call("POST", EXEC, body, ExecResult, timeout=timeout_ms / 1000 + 30)

    def sh(self, script: str, *, timeout_ms: int = 60_000) -> ExecResult:
        """``sh -c script``: convenient for probes."""
        return self.exec(["sh", "-c", script], timeout_ms=timeout_ms)

    def _call(
        self, method: str, path: str, body: object | None, model: type[T], *, timeout: float
    ) -> T:
        connection = _UnixConnection(self.socket_path, timeout)
        headers = {"content-type": "application/json"} if body is not None else {}
        try:
            connection.request(
                method, path, codec.dumps(body) if body is not None else None, headers
            )
            response = connection.getresponse()
            status, content = response.status, _read_bounded(response)
        except (OSError, http.client.HTTPException) as exc:
            raise AgentUnreachable(f"agent at {self.socket_path}: {exc!r}") from exc
        finally:
            connection.close()
        if status != 200:
            raise AgentError(status, _refusal(content))
        try:
            return codec.loads(model, content, strict=False)
        except WireError as exc:
            raise AgentError(status, f"unexpected answer: {exc}") from None


class _UnixConnection(http.client.HTTPConnection):
    """One HTTP/1.1 exchange over a unix socket (``close`` ends it)."""

    def __init__(self, path: Path, timeout: float) -> None:
        super().__init__("agent", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(str(self._path))
        except BaseException:
            sock.close()
            raise
        self.sock = sock


def _read_bounded(response: http.client.HTTPResponse) -> bytes:
    """The body, unless it passes :data:`MAX_ANSWER_BYTES`."""
    declared = response.getheader("content-length", "")
    if declared.isdigit() and int(declared) > MAX_ANSWER_BYTES:
        raise AgentError(response.status, f"answer of {declared} bytes is over the limit")
    content = response.read(MAX_ANSWER_BYTES + 1)  # whatever the framing, no further
    if len(content) > MAX_ANSWER_BYTES:
        raise AgentError(response.status, f"answer over {MAX_ANSWER_BYTES} bytes: not read further")
    return content


def _refusal(content: bytes) -> str:
    """The agent's ``CODE: message``, or the start of whatever else it sent."""
    try:
        refusal = codec.loads(ErrorBody, content, strict=False)
    except WireError:
        return content[:500].decode(errors="replace")
    return f"{refusal.code}: {refusal.error}"
