"""The console's terminal as the page opens it, for tests of ``podbay serve``
and of a cluster's control replicas (which relay it to the sandbox's node).

>>> terminal_url("http://127.0.0.1:8700", "/console/sandboxes/d/s")
'ws://127.0.0.1:8700/console/sandboxes/d/s/v1/pty'
"""

from __future__ import annotations

import json

from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

__all__ = ["run_in_terminal", "terminal_refused", "terminal_url"]


def terminal_url(base_url: str, sandbox_base: str) -> str:
    """The terminal's WebSocket URL of the sandbox whose console path is
    ``sandbox_base`` (``/console/sandboxes/<deployment>/<name>``)."""
    return base_url.replace("http://", "ws://", 1) + f"{sandbox_base}/v1/pty"


def terminal_refused(url: str, session: str | None, origin: str | None) -> tuple[int, bytes]:
    """The status and body a terminal opened with this session cookie (None:
    none) from ``origin`` (None: no ``Origin`` header) is refused with;
    AssertionError when it is not refused."""
    headers = {} if session is None else {"Cookie": f"podbay_session={session}"}
    try:
        connect(url, additional_headers=headers, origin=origin)  # type: ignore[arg-type]
    except InvalidStatus as refused:
        return refused.response.status_code, bytes(refused.response.body or b"")
    raise AssertionError(f"the terminal opened from {origin!r} without its checks")


def run_in_terminal(url: str, session: str, origin: str, *, exit_code: int = 0) -> None:
    """Open a terminal with the console's session cookie from the console's
    ``origin``, run ``sh``, see a command's output (``echo h''i`` echoes as
    typed, so only the output holds ``hi``) and the exit the shell is left
    with (``exit_code``) arrive."""
    cookie = {"Cookie": f"podbay_session={session}"}
    with connect(url, additional_headers=cookie, origin=origin) as ws:  # type: ignore[arg-type]
        ws.send(json.dumps({"command": ["sh"], "rows": 24, "cols": 80}))
        ws.send(b"echo h''i\n")
        seen = b""
        while b"hi\r\n" not in seen:
            message = ws.recv(timeout=60)
            assert isinstance(message, bytes), message
            seen += message
        ws.send(f"exit {exit_code}\n".encode())
        while isinstance(message := ws.recv(timeout=60), bytes):
            pass
        assert json.loads(message) == {"type": "exit", "exit_code": exit_code}
