"""A foreground command's Start costs the data plane no more round trips than
it must (podbay.e2b.processes): the agent forgets the finished process after
the stream has ended, not before, and a Start lists the agent's processes
only when one started here is left unfollowed."""

from __future__ import annotations

from typing import Any, cast

import httpx
import pytest

from podbay.control.services.sandboxes import Attached
from podbay.e2b import processes
from podbay.e2b.service import E2BService
from podbay.wire.paths import process_path

pytestmark = pytest.mark.anyio

SANDBOX = "sbx"
PROCESS = "0000002a-cafe"


async def test_the_agent_forgets_a_finished_command_after_its_stream_ends(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    log: list[str] = []

    async def call(_: object, __: object, method: str, path: str, **___: Any) -> httpx.Response:
        log.append(f"{method} {path}")
        status = {
            "state": "exited",
            "exit_code": 0,
            "stdout": "",
            "stderr": "",
            "stdout_next": 0,
            "stderr_next": 0,
        }
        return httpx.Response(200, json=status if method == "GET" else {})

    monkeypatch.setattr(processes, "call", call)
    registry = processes.Registry()
    registry.started[(SANDBOX, PROCESS)] = processes.Started(None, "true", [], {}, None)
    service, attached = cast(E2BService, object()), cast(Attached, object())
    async for _ in processes._follow(service, registry, SANDBOX, attached, PROCESS, (0, 0)):
        pass
    log.append("stream ended")
    assert (SANDBOX, PROCESS) not in registry.started
    for task in list(registry.cleanups):
        await task
    assert log == [
        f"GET {process_path(PROCESS)}",
        "stream ended",
        f"DELETE {process_path(PROCESS)}",
    ]
    assert not registry.cleanups


def test_only_an_unfollowed_process_calls_for_a_prune() -> None:
    registry = processes.Registry()
    assert not registry.unfollowed(SANDBOX)
    followed = processes.Started(None, "sleep", ["9"], {}, None, followers=1)
    registry.started[(SANDBOX, "p-1")] = followed
    registry.started[("other", "p-2")] = processes.Started(None, "sleep", ["9"], {}, None)
    assert not registry.unfollowed(SANDBOX)
    followed.followers = 0
    assert registry.unfollowed(SANDBOX)
