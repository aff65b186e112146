"""Talk to a machine's agent from the host, synchronously: ``info`` and ``exec``.

For the runtime's own checks (``podbay doctor``, the conformance and
isolation suites, the benchmark), not for serving users: the gateway relays
those. Plain ``http.client`` over the unix socket :meth:`Driver.agent_socket`
returns.

>>> AgentClient(Path("/nonexistent.sock")).socket_path.name
'nonexistent.sock'
"""

from __future__ import annotations

import http.client
import json
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from podbay.errors import AgentError as AgentError  # re-exported: defined in the one tree

from ..wire.paths import EXEC, INFO


@dataclass(frozen=True)
class ExecResult:
    exit_code: int
    stdout: str
    stderr: str
    timed_out: bool

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


class _UnixConnection(http.client.HTTPConnection):
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


class AgentClient:
    def __init__(self, socket_path: Path, *, timeout: float = 120.0) -> None:
        self.socket_path = socket_path
        self.timeout = timeout

    def request(self, method: str, path: str, body: Any = None,
                timeout: float | None = None) -> tuple[int, Any]:
        conn = _UnixConnection(self.socket_path, timeout or self.timeout)
        try:
            data = None if body is None else json.dumps(body).encode()
            headers = {"Content-Type": "application/json"} if data is not None else {}
            conn.request(method, path, body=data, headers=headers)
            response = conn.getresponse()
            raw = response.read()
        finally:
            conn.close()
        try:
            return response.status, json.loads(raw) if raw else None
        except ValueError:
            return response.status, raw.decode(errors="replace")

    def info(self) -> dict[str, Any]:
        status, body = self.request("GET", INFO, timeout=10)
        if status != 200:
            raise AgentError(status, body)
        return dict(body)

    def exec(self, command: list[str], *, timeout_ms: int = 60_000, cwd: str | None = None,
             env: dict[str, str] | None = None) -> ExecResult:
        payload: dict[str, Any] = {"command": command, "timeout_ms": timeout_ms}
        if cwd is not None:
            payload["cwd"] = cwd
        if env:
            payload["env"] = env
        status, body = self.request("POST", EXEC, payload, timeout=timeout_ms / 1000 + 30)
        if status != 200:
            raise AgentError(status, body)
        return ExecResult(int(body["exit_code"]), body.get("stdout", ""),
                          body.get("stderr", ""), bool(body.get("timed_out")))

    def sh(self, script: str, *, timeout_ms: int = 60_000) -> ExecResult:
        """``sh -c script``: convenient for probes."""
        return self.exec(["sh", "-c", script], timeout_ms=timeout_ms)
