"""probes.unreachable: which of several addresses accept a connection, all tried
at once, with the probe's own shell script run here instead of in a sandbox."""

from __future__ import annotations

import socket
import subprocess
from typing import Any

from podbay.runtime import probes
from podbay.wire.data import ExecResult


class HereAgent:
    """Runs the command on this host, as an agent would run it in its sandbox."""

    def __init__(self) -> None:
        self.calls = 0

    def exec(self, command: list[str], *, timeout_ms: int = 60_000, **_: Any) -> ExecResult:
        self.calls += 1
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout_ms / 1000)
        return ExecResult(
            exit_code=done.returncode,
            stdout=done.stdout,
            stderr=done.stderr,
            duration_ms=0,
            timed_out=False,
            truncated=False,
        )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_each_reached_target_is_named_and_the_others_are_not() -> None:
    with socket.create_server(("127.0.0.1", 0)) as listening:
        port = listening.getsockname()[1]
        closed = free_port()
        agent = HereAgent()
        found = probes.unreachable(agent, [("127.0.0.1", closed), ("127.0.0.1", port)])  # type: ignore[arg-type]
    assert found == f"reached 127.0.0.1:{port}"
    assert agent.calls == 1


def test_nothing_reached_is_none_with_silent_targets_in_one_call() -> None:
    # 192.0.2.0/24 (TEST-NET-1) is not routed: each attempt waits out its 3 s,
    # all in the one command, side by side.
    agent = HereAgent()
    targets = [("127.0.0.1", free_port()), ("192.0.2.1", 80), ("192.0.2.2", 80), ("192.0.2.3", 80)]
    assert probes.unreachable(agent, targets) is None  # type: ignore[arg-type]
    assert agent.calls == 1
