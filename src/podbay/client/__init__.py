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

from podbay.wire._lazy import lazy_getattr

TYPE_CHECKING = False  # importing typing slows every CLI start; mypy reads this name

# Loaded on first use: the synchronous client alone does not pay for the
# asynchronous one (anyio), and the CLI's quick exec path can import
# ``podbay.client._config`` without any of them.
# A name → module table like podbay.wire's, on purpose: each package loads its
# own names lazily (one shared table would make either import the other).
_EXPORTS: dict[str, str] = {
    "PodbayError": "podbay.errors",
    "SandboxNotEnabledError": "podbay.errors",
    "SandboxPreparingError": "podbay.errors",
    "SandboxRequestError": "podbay.errors",
    "SandboxUnavailableError": "podbay.errors",
    "InterpreterError": "podbay.errors",
    "AsyncCodeInterpreter": "podbay.client._async.client",
    "CodeInterpreter": "podbay.client._sync.client",
    "CodeResult": "podbay.client._interpreter",
    "Execution": "podbay.client._interpreter",
    "ExecutionError": "podbay.client._interpreter",
    "AsyncSandbox": "podbay.client._async.client",
    "AsyncSandboxClient": "podbay.client._async.client",
    "AsyncTerminal": "podbay.client._async.client",
    "Sandbox": "podbay.client._sync.client",
    "SandboxClient": "podbay.client._sync.client",
    "Terminal": "podbay.client._sync.client",
    "token_issuer": "podbay.client._config",
    "Cancel": "podbay.client._models",
    "BytesResult": "podbay.client._models",
    "CombinedResult": "podbay.client._models",
    "ExecEvent": "podbay.client._models",
    "FileInfo": "podbay.client._models",
    "DirEntry": "podbay.client._models",
    "ExecResult": "podbay.client._models",
    "GrepMatch": "podbay.client._models",
    "ProcessOutput": "podbay.client._models",
    "ProcessStatus": "podbay.client._models",
    "Progress": "podbay.client._models",
    "RunResult": "podbay.client._models",
    "SandboxHandle": "podbay.client._models",
    "SandboxRecord": "podbay.client._models",
    "NetworkPolicy": "podbay.client._models",
    "Volume": "podbay.client._models",
    "VolumeEntry": "podbay.client._models",
    "VolumeMount": "podbay.client._models",
    "EgressAudit": "podbay.client._models",
    "ForkResult": "podbay.client._models",
    "EgressDestination": "podbay.client._models",
    "Preparing": "podbay.client._models",
    "BuildStep": "podbay.client._models",
    "Metrics": "podbay.client._models",
    "MetricSample": "podbay.client._models",
    "EventList": "podbay.client._models",
    "SandboxEvent": "podbay.client._models",
    "CommandList": "podbay.client._models",
    "CommandEntry": "podbay.client._models",
}

# BytesResult, ExecEvent and FileInfo (results of exec_bytes, stream and stat),
# Preparing and BuildStep (what on_preparing gets), the observability answers
# (metrics, events, commands) resolve as attributes but
# stay out of the pinned star-import surface.
# ``podbay.__all__`` repeats most of this list on purpose (a deliberate twin):
# ``import podbay`` must not load the client to learn its names;
# tests/unit/test_public_api.py pins both.
__all__ = [
    "AsyncCodeInterpreter",
    "AsyncSandbox",
    "AsyncSandboxClient",
    "AsyncTerminal",
    "Cancel",
    "CodeInterpreter",
    "CodeResult",
    "CombinedResult",
    "DirEntry",
    "ExecResult",
    "Execution",
    "ExecutionError",
    "GrepMatch",
    "InterpreterError",
    "NetworkPolicy",
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
    "Terminal",
    "Volume",
    "VolumeEntry",
    "VolumeMount",
    "token_issuer",
]

if TYPE_CHECKING:  # pragma: no cover
    from podbay.errors import (
        InterpreterError,
        PodbayError,
        SandboxNotEnabledError,
        SandboxPreparingError,
        SandboxRequestError,
        SandboxUnavailableError,
    )

    from ._async.client import AsyncCodeInterpreter, AsyncSandbox, AsyncSandboxClient, AsyncTerminal
    from ._config import token_issuer
    from ._interpreter import CodeResult, Execution, ExecutionError
    from ._models import (
        BuildStep as BuildStep,
    )
    from ._models import (
        BytesResult as BytesResult,
    )
    from ._models import (
        Cancel,
        CombinedResult,
        DirEntry,
        ExecResult,
        GrepMatch,
        NetworkPolicy,
        ProcessOutput,
        ProcessStatus,
        Progress,
        RunResult,
        SandboxHandle,
        SandboxRecord,
        Volume,
        VolumeEntry,
        VolumeMount,
    )
    from ._models import (
        ExecEvent as ExecEvent,
    )
    from ._models import (
        FileInfo as FileInfo,
    )
    from ._models import (
        Preparing as Preparing,
    )
    from ._sync.client import CodeInterpreter, Sandbox, SandboxClient, Terminal


__getattr__ = lazy_getattr(__name__, _EXPORTS)
