"""The public surface is pinned: a name added or removed is a deliberate change."""

from __future__ import annotations

import pytest

import podbay
import podbay.client

PODBAY = [
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
CLIENT = [
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
    "NetworkPolicy",  # set_network / network (docs/network.md)
    "Volume",  # create_volume, list_volumes ... (docs/volumes.md)
    "VolumeEntry",
    "VolumeMount",
    "SandboxRequestError",
    "SandboxUnavailableError",
    "token_issuer",
    "AsyncTerminal",
    "Terminal",
    # The code interpreter (run_code).
    "AsyncCodeInterpreter",
    "CodeInterpreter",
    "CodeResult",
    "Execution",
    "ExecutionError",
    "InterpreterError",
]
METHODS = [
    "attach",
    "exec",
    "exec_combined",
    "run",
    "spawn",
    "poll",
    "processes",
    "signal",
    "kill",
    "read_file",
    "read_file_bytes",
    "write_file",
    "write_file_bytes",
    "list_dir",
    "grep",
    "upload",
    "download",
    "get",
    "list",
    "stop",
    "delete",
    "sandbox",
    "run_code",
]


def test_podbay_all_is_pinned() -> None:
    assert sorted(podbay.__all__) == sorted(PODBAY)
    for name in podbay.__all__:
        assert getattr(podbay, name) is not None


def test_podbay_public_names_are_all_and_only_all() -> None:
    """What ``dir(podbay)`` shows is ``__all__``, and nothing else resolves."""
    assert dir(podbay) == sorted(PODBAY)
    with pytest.raises(AttributeError):
        podbay.Cancel  # noqa: B018 - podbay.client's, not podbay's


def test_client_all_is_pinned() -> None:
    assert sorted(podbay.client.__all__) == sorted(CLIENT)
    for name in podbay.client.__all__:
        assert getattr(podbay.client, name) is not None


def test_both_faces_have_every_reference_method() -> None:
    for cls in (podbay.SandboxClient, podbay.AsyncSandboxClient):
        for method in METHODS:
            assert callable(getattr(cls, method)), (cls, method)
    for cls in (podbay.Sandbox, podbay.AsyncSandbox):
        for method in METHODS:
            if method not in ("list", "sandbox"):
                assert callable(getattr(cls, method)), (cls, method)


def test_the_same_objects_everywhere() -> None:
    assert podbay.SandboxClient is podbay.client.SandboxClient
    assert podbay.SandboxRequestError is podbay.client.SandboxRequestError
    from podbay.wire import data

    assert podbay.ExecResult is data.ExecResult  # one source of truth: the wire model
