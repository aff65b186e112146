"""A terminal client that stops reading under heavy output, then leaves.

Seen before: uvicorn logged an AssertionError traceback for it; a client
going away is a disconnect, not a server error.
"""

from __future__ import annotations

import fcntl
import json
import socket
import struct
import termios
import time
from collections.abc import Iterator
from typing import Any

import pytest
from websockets.sync.client import connect

from podbay.testing.platform import PlatformServer

pytestmark = [pytest.mark.root, pytest.mark.timeout(300)]

#: Bytes waiting unread in the client's socket: the server's sends to it stall
#: long before (its own buffers fill too).
STALLED = 64 * 1024


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PlatformServer]:
    with PlatformServer.start(tmp_path_factory.mktemp("serve")) as s:
        yield s


@pytest.fixture(scope="module")
def handle(server: PlatformServer) -> dict[str, Any]:
    token = server.create_deployment("terminal-stall")
    r = server.attach(token, "terminal-stall")
    assert r.status_code == 200, r.text
    return dict(r.json())


def _unread(sock: socket.socket) -> int:
    return int(struct.unpack("i", fcntl.ioctl(sock, termios.FIONREAD, b"\0\0\0\0"))[0])


@pytest.mark.parametrize("leave", ["close", "reset"])
def test_a_stalled_terminal_client_that_leaves_is_a_disconnect(
    server: PlatformServer, handle: dict[str, Any], leave: str
) -> None:
    url = handle["endpoint"].replace("http://", "ws://", 1) + "/v1/pty"
    logged = len(server.log_path.read_bytes())
    ws = connect(url, additional_headers=handle["headers"], max_queue=1)
    ws.send(json.dumps({"command": ["yes", "podbay"]}))
    # Not read: the client's queue fills, then its socket's buffer.
    while _unread(ws.socket) < STALLED:
        time.sleep(0.05)
    if leave == "reset":
        ws.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        ws.socket.close()
    else:
        ws.close()
    # The server goes on serving, and logged no traceback for it.
    r = server.exec(handle, "echo", "after")
    assert r.status_code == 200, r.text
    assert r.json()["stdout"] == "after\n", r.text
    log = server.log_path.read_bytes()[logged:].decode(errors="replace")
    assert "Traceback" not in log, log[-3000:]
    assert "AssertionError" not in log, log[-3000:]
