"""podbay: self-hostable sandboxes for AI agents.

>>> from podbay import SandboxClient  # doctest: +SKIP
>>> with SandboxClient() as sandboxes:  # doctest: +SKIP
...     print(sandboxes.exec("thread-42", ["python3", "-c", "print(2 + 2)"]).stdout)
4

Names are imported lazily so that the agent (which runs inside the sandbox
with the image's bare interpreter) and the CLI do not pay for the client.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS: dict[str, str] = {
    "SandboxClient": "podbay.client",
    "AsyncSandboxClient": "podbay.client",
    "Sandbox": "podbay.client",
    "AsyncSandbox": "podbay.client",
    "ExecResult": "podbay.client",
    "CombinedResult": "podbay.client",
    "RunResult": "podbay.client",
    "ProcessStatus": "podbay.client",
    "ProcessOutput": "podbay.client",
    "DirEntry": "podbay.client",
    "GrepMatch": "podbay.client",
    "SandboxRecord": "podbay.client",
    "SandboxHandle": "podbay.client",
    "PodbayError": "podbay.errors",
    "SandboxRequestError": "podbay.errors",
    "SandboxNotEnabledError": "podbay.errors",
    "SandboxPreparingError": "podbay.errors",
    "SandboxUnavailableError": "podbay.errors",
}

__all__ = [
    "AsyncSandbox",
    "AsyncSandboxClient",
    "CombinedResult",
    "DirEntry",
    "ExecResult",
    "GrepMatch",
    "PodbayError",
    "ProcessOutput",
    "ProcessStatus",
    "RunResult",
    "Sandbox",
    "SandboxClient",
    "SandboxHandle",
    "SandboxNotEnabledError",
    "SandboxPreparingError",
    "SandboxRecord",
    "SandboxRequestError",
    "SandboxUnavailableError",
    "__version__",
]

if TYPE_CHECKING:  # pragma: no cover
    from podbay.client import (
        AsyncSandbox,
        AsyncSandboxClient,
        CombinedResult,
        DirEntry,
        ExecResult,
        GrepMatch,
        ProcessOutput,
        ProcessStatus,
        RunResult,
        Sandbox,
        SandboxClient,
        SandboxHandle,
        SandboxRecord,
    )
    from podbay.errors import (
        PodbayError,
        SandboxNotEnabledError,
        SandboxPreparingError,
        SandboxRequestError,
        SandboxUnavailableError,
    )


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'podbay' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
