"""The Python SDK: :class:`SandboxClient` and :class:`AsyncSandboxClient`.

The faithful twin of the reference (TypeScript) client: the same methods,
semantics and errors, with Pythonic names and typed, frozen results.

>>> from podbay.client import SandboxClient
>>> with SandboxClient() as sandboxes:  # doctest: +SKIP
...     print(sandboxes.exec("thread-42", ["python3", "-c", "print(2 + 2)"]).stdout)
4

Layout: ``_core`` (sans-I/O: requests, answers, errors, handle cache),
``_files`` and ``_run`` (sans-I/O helpers), ``_models`` (result types),
``_async/client.py`` (written) and ``_sync/client.py`` (generated from it
by ``scripts/unasync.py``; a test checks it is up to date).

Errors (from :mod:`podbay.errors`)::

    PodbayError
    ├── SandboxRequestError(status, message, code)  the server refused
    │   ├── SandboxNotEnabledError       409 SANDBOXES_NOT_CONFIGURED / SANDBOX_NOT_DECLARED
    │   └── SandboxPreparingError(retry_after)   still 202 after prepare_timeout_seconds
    └── SandboxUnavailableError(message, cause)  no answer; never retried
"""

from __future__ import annotations

from podbay.errors import (
    PodbayError,
    SandboxNotEnabledError,
    SandboxPreparingError,
    SandboxRequestError,
    SandboxUnavailableError,
)

from ._async.client import AsyncSandbox, AsyncSandboxClient
from ._core import token_issuer
from ._models import (
    Cancel,
    CombinedResult,
    DirEntry,
    ExecResult,
    GrepMatch,
    ProcessOutput,
    ProcessStatus,
    Progress,
    RunResult,
    SandboxHandle,
    SandboxRecord,
)
from ._sync.client import Sandbox, SandboxClient

__all__ = [
    "AsyncSandbox",
    "AsyncSandboxClient",
    "Cancel",
    "CombinedResult",
    "DirEntry",
    "ExecResult",
    "GrepMatch",
    "PodbayError",
    "ProcessOutput",
    "ProcessStatus",
    "Progress",
    "RunResult",
    "Sandbox",
    "SandboxClient",
    "SandboxHandle",
    "SandboxNotEnabledError",
    "SandboxPreparingError",
    "SandboxRecord",
    "SandboxRequestError",
    "SandboxUnavailableError",
    "token_issuer",
]
