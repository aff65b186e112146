"""The host's own calls to an agent (environment builds, setup commands,
probes) read a bounded answer: code in the sandbox may answer in the
agent's place, and an endless body used to be read whole into the server."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import pytest

from podbay.errors import AgentError
from podbay.runtime.agent_client import AgentClient

pytestmark = pytest.mark.timeout(120)


def hostile_agent(path: Path, head: bytes, body_total: int, written: list[int]) -> None:
    """Answer one request with ``head`` and then up to ``body_total`` bytes."""
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(path))
    listener.listen(1)

    def serve() -> None:
        conn, _ = listener.accept()
        conn.recv(65536)
        total = 0
        try:
            conn.sendall(head)
            chunk = b"x" * 65536
            while total < body_total:
                conn.sendall(chunk)
                total += len(chunk)
        except OSError:
            pass
        finally:
            written.append(total)
            conn.close()
            listener.close()

    threading.Thread(target=serve, daemon=True).start()


@pytest.mark.parametrize("framing", [b"content-length: %d\r\n", b"transfer-encoding: chunked\r\n"])
def test_endless_answer_is_cut_off(tmp_path: Path, framing: bytes) -> None:
    total = 256 * 1024 * 1024
    head = (
        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
        + (framing % total if b"%d" in framing else framing)
        + b"\r\n"
    )
    if b"chunked" in framing:
        head += b"%x\r\n" % total  # one chunk that never ends
    written: list[int] = []
    hostile_agent(tmp_path / "a.sock", head, total, written)
    with pytest.raises(AgentError):
        AgentClient(tmp_path / "a.sock", timeout=60).exec(["true"])
    for _ in range(600):
        if written:
            break
        threading.Event().wait(0.05)
    assert written
    assert written[0] < 64 * 1024 * 1024 < total
