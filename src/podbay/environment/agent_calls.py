"""The two agent calls environments need: exec a step, and nothing else.

Builds and setup commands talk to the agent directly on its host socket
(they are platform work, not a client's data-plane traffic).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import httpx

from podbay.wire import codec, paths
from podbay.wire.data import ExecRequest, ExecResult


async def agent_exec(
    socket: Path,
    argv: tuple[str, ...] | list[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | None = None,
    timeout_s: float,
) -> ExecResult:
    """Run ``argv`` through the agent at ``socket`` and wait for it."""
    request = ExecRequest(command=list(argv), cwd=cwd, env=dict(env) if env else None,
                          timeout_ms=int(timeout_s * 1000))
    transport = httpx.AsyncHTTPTransport(uds=str(socket))
    async with httpx.AsyncClient(transport=transport, base_url="http://agent",
                                 timeout=timeout_s + 30) as client:
        response = await client.post(paths.EXEC, content=codec.dumps(request),
                                     headers={"content-type": "application/json"})
    if response.status_code != 200:
        body = response.json() if response.content else {}
        return ExecResult(exit_code=127, stdout="", stderr=str(body.get("error", response.text)),
                          duration_ms=0, timed_out=False, truncated=False)
    return codec.loads(ExecResult, response.content, strict=False)


def tail(text: str, lines: int = 20) -> str:
    """The last ``lines`` lines of some output, for an error message."""
    return "\n".join(text.rstrip().splitlines()[-lines:])
