"""podbay: self-hostable sandboxes for AI agents.

>>> from podbay import SandboxClient  # doctest: +SKIP
>>> with SandboxClient() as sandboxes:  # doctest: +SKIP
...     print(sandboxes.exec("thread-42", ["python3", "-c", "print(2 + 2)"]).stdout)
4

Names are imported lazily so that the agent (which runs inside the sandbox
with the image's bare interpreter) and the CLI do not pay for the client.
"""

from __future__ import annotations

from podbay.wire._lazy import lazy_getattr

TYPE_CHECKING = False  # importing typing slows every CLI start; mypy reads this name

__version__ = "0.1.0"

#: The public names, listed once: each (but ``__version__``) is
#: :mod:`podbay.client`'s, imported on first use. A deliberate twin of most of
#: ``podbay.client.__all__``, which adds the helpers (Cancel, Progress,
#: token_issuer); tests/unit/test_public_api.py pins both.
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

if TYPE_CHECKING:  # pragma: no cover - what type checkers see of the lazy names
    from podbay.client import *


if not TYPE_CHECKING:
    # Hidden from type checkers: a module __getattr__ would let them accept
    # `from podbay import anything` (a removed module's name included).
    __getattr__ = lazy_getattr(__name__, dict.fromkeys(__all__, "podbay.client"))


def __dir__() -> list[str]:
    return sorted(__all__)
