"""How long the gateway waits for an agent to start its answer.

An agent that stops (guest root stopped or traced it, or its machine hangs)
would otherwise hold every call until the client gives up. The wait starts
once the request's body is delivered and ends with the answer's head:

- an exec: its own ``timeout_ms`` (the agent's default when it names none;
  the longest allowed when its body streams and is not read here), plus the
  operator's bound (``server.agent_answer_seconds``) as the margin;
- a process poll (``GET /v1/processes/{id}``): the bound plus the longest
  ``wait_ms``;
- every other call: the bound.

>>> answer_wait(b"POST", b"/v1/exec", b'{"command": ["true"], "timeout_ms": 1500}', 30.0)
31.5
>>> answer_wait(b"POST", b"/v1/exec", b'{"command": ["true"]}', 30.0)
90.0
>>> answer_wait(b"GET", b"/v1/files?path=a", b"", 30.0)
30.0
"""

from __future__ import annotations

import re

from podbay.wire.limits import EXEC_DEFAULT_TIMEOUT_MS, EXEC_MAX_TIMEOUT_MS, POLL_WAIT_MAX_MS
from podbay.wire.paths import EXEC, PROCESSES

_EXEC = EXEC.encode()
_PROCESSES = PROCESSES.encode() + b"/"
#: Every ``timeout_ms`` in the body: the largest counts, so that a string that
#: looks like one (in a command's arguments) can only lengthen the wait.
_TIMEOUT_MS = re.compile(rb'"timeout_ms"\s*:\s*(\d{1,12})')


def answer_wait(method: bytes, target: bytes, body: bytes | None, bound: float) -> float:
    """Seconds to wait for the answer's head (``body``: the whole request body,
    None when it streams)."""
    path = target.split(b"?", 1)[0]
    if path == _EXEC:
        if body is None:
            ms = EXEC_MAX_TIMEOUT_MS
        else:
            found = [int(value) for value in _TIMEOUT_MS.findall(body)]
            ms = min(max(found), EXEC_MAX_TIMEOUT_MS) if found else EXEC_DEFAULT_TIMEOUT_MS
        return ms / 1000 + bound
    if method == b"GET" and path.startswith(_PROCESSES):
        return POLL_WAIT_MAX_MS / 1000 + bound
    return bound
