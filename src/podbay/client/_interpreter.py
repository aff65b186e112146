"""The code interpreter's client side, sans I/O: where the kernel lives, how to
start it, and its answers as typed results.

The kernel (``_kernel.py``, stdlib only) runs INSIDE the sandbox as a spawned
process and serves ``127.0.0.1:KERNEL_PORT``; the SDK reaches it through the
gateway's port relay. One kernel per sandbox, shared by every client of it.
"""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from podbay.errors import InterpreterError

#: The port the kernel listens on inside the sandbox (loopback only).
KERNEL_PORT = 49999
KERNEL_DIR = "/tmp/.podbay-interpreter"
TOKEN_FILE = f"{KERNEL_DIR}/token"
TOKEN_HEADER = "X-Podbay-Interpreter-Token"
#: How long a new kernel may take to publish its token and answer.
START_TIMEOUT_SECONDS = 30.0
__all__ = ["CodeResult", "Execution", "ExecutionError", "InterpreterError"]

#: After an interrupt, how long the cell has to stop before the kernel is killed.
INTERRUPT_GRACE_SECONDS = 5.0


def kernel_source() -> bytes:
    return (Path(__file__).with_name("_kernel.py")).read_bytes()


def kernel_path(source: bytes) -> str:
    """Where the kernel's source is written: by content, so versions never mix."""
    return f"{KERNEL_DIR}/kernel-{hashlib.sha256(source).hexdigest()[:12]}.py"


def kernel_command(path: str) -> list[str]:
    return ["python3", "-u", path, str(KERNEL_PORT), TOKEN_FILE]


@dataclass(frozen=True, kw_only=True)
class CodeResult:
    """One displayed object: the cell's last expression (``is_main_result``) or a
    figure the cell left open. ``formats`` maps MIME types to data."""

    is_main_result: bool
    formats: dict[str, Any]

    @property
    def text(self) -> str | None:
        """The object's ``repr``."""
        value = self.formats.get("text/plain")
        return value if isinstance(value, str) else None

    @property
    def png(self) -> bytes | None:
        value = self.formats.get("image/png")
        return base64.b64decode(value) if isinstance(value, str) else None

    @property
    def html(self) -> str | None:
        value = self.formats.get("text/html")
        return value if isinstance(value, str) else None

    @property
    def json(self) -> Any:
        return self.formats.get("application/json")


@dataclass(frozen=True, kw_only=True)
class ExecutionError:
    """An exception the cell raised: its class name, ``str()`` and traceback.

    ``name`` is ``"InterpreterCrashed"`` when the interpreter process died
    while running the cell (its state is lost; the next cell starts afresh).
    """

    name: str
    value: str
    traceback: str


@dataclass(frozen=True, kw_only=True)
class Execution:
    """:meth:`~podbay.SandboxClient.run_code`'s answer.

    ``restarted`` is true when this cell ran in a NEW interpreter because the
    previous one was gone (the sandbox was suspended and resumed, or the
    interpreter crashed or was killed): variables from earlier cells are lost.
    ``timed_out`` says ``timeout_ms`` interrupted the cell (then ``error`` is a
    ``KeyboardInterrupt``); the interpreter and its state remain.
    """

    stdout: str
    stderr: str
    results: list[CodeResult] = field(default_factory=list)
    error: ExecutionError | None = None
    execution_count: int = 0
    timed_out: bool = False
    restarted: bool = False
    kernel_id: str = ""

    @property
    def result(self) -> CodeResult | None:
        """The last expression's value (``None`` when the cell ended in a statement)."""
        return next((r for r in self.results if r.is_main_result), None)

    @property
    def text(self) -> str | None:
        """``repr`` of the last expression's value: ``run_code("1 + 1").text == "2"``."""
        main = self.result
        return main.text if main is not None else None


def parse_execution(payload: Any, *, restarted: bool) -> Execution:
    """The kernel's ``/run`` answer as an :class:`Execution`."""
    if not isinstance(payload, dict):
        raise InterpreterError(f"the interpreter answered {payload!r}")
    results = [
        CodeResult(is_main_result=bool(r.get("main")), formats=dict(r.get("formats") or {}))
        for r in payload.get("results") or []
        if isinstance(r, dict)
    ]
    raw_error = payload.get("error")
    error = None
    if isinstance(raw_error, dict):
        error = ExecutionError(
            name=str(raw_error.get("name", "")),
            value=str(raw_error.get("value", "")),
            traceback=str(raw_error.get("traceback", "")),
        )
    return Execution(
        stdout=str(payload.get("stdout", "")),
        stderr=str(payload.get("stderr", "")),
        results=results,
        error=error,
        execution_count=int(payload.get("execution_count") or 0),
        timed_out=bool(payload.get("timed_out")),
        restarted=restarted,
        kernel_id=str(payload.get("kernel_id", "")),
    )


def crashed(detail: str) -> Execution:
    """The cell's answer when the interpreter died under it."""
    message = (
        f"the interpreter process died while running this cell ({detail}); "
        "its state is lost and the next run_code starts a new interpreter"
    )
    return Execution(
        stdout="",
        stderr="",
        error=ExecutionError(
            name="InterpreterCrashed", value=message, traceback=f"InterpreterCrashed: {message}\n"
        ),
    )


def run_body(code: str, timeout_ms: int | None) -> bytes:
    if not isinstance(code, str):
        raise TypeError("code must be a str")
    if timeout_ms is not None and (isinstance(timeout_ms, bool) or timeout_ms <= 0):
        raise ValueError("timeout_ms must be a positive integer")
    return json.dumps({"code": code, "timeout_ms": timeout_ms}).encode()


def is_port_unreachable(status: int, body: bytes) -> bool:
    """The relay's answer when nothing listens on the kernel's port (no kernel)."""
    if status != 502:
        return False
    try:
        return bool(json.loads(body).get("code") == "PORT_UNREACHABLE")
    except (ValueError, AttributeError):
        return False
