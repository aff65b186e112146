"""Every body the control plane and the gateway read is bounded: by its
declared length (refused before it is read) and while it streams (refused
as it passes the limit), with 413 ``REQUEST_TOO_LARGE``.

Attach used to read its whole body into memory (512 MiB took the server
to 1 GiB); a data-plane JSON body over the agent's limit came back as 502.
"""

from __future__ import annotations

import hashlib
import socket
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from podbay.testing.platform import PlatformServer
from podbay.wire.limits import MAX_CONTROL_BODY, MAX_JSON_BODY

pytestmark = [pytest.mark.root, pytest.mark.timeout(300)]

NAME = "bodies"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PlatformServer]:
    with PlatformServer.start(tmp_path_factory.mktemp("serve")) as s:
        yield s


@pytest.fixture(scope="module")
def token(server: PlatformServer) -> str:
    return server.create_deployment("bodies")


@pytest.fixture(scope="module")
def handle(server: PlatformServer, token: str) -> dict[str, Any]:
    r = server.attach(token, NAME)
    assert r.status_code == 200, r.text
    return dict(r.json())


def head_only(port: int, head: str) -> bytes:
    """Send a head that promises a huge body, send none of it, read the answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(head.encode() + b"\r\n")
        answer = b""
        while b"\r\n\r\n" not in answer or b"}" not in answer:
            data = sock.recv(65536)
            if not data:
                break
            answer += data
        return answer


def chunks(total: int, size: int = 256 * 1024) -> Iterator[bytes]:
    sent = 0
    while sent < total:
        yield b"[" * size
        sent += size


def test_attach_declaring_512_mib_is_413_before_reading(server: PlatformServer, token: str) -> None:
    answer = head_only(
        server.port,
        f"PUT /api/v1/sandboxes/{NAME} HTTP/1.1\r\nHost: x\r\n"
        f"Authorization: Bearer {token}\r\nContent-Length: {512 << 20}\r\n",
    )
    assert answer.startswith(b"HTTP/1.1 413 "), answer[:200]
    assert b"REQUEST_TOO_LARGE" in answer


def test_attach_streaming_past_the_limit_is_413(server: PlatformServer, token: str) -> None:
    r = server.attach(token, NAME, content=chunks(4 * MAX_CONTROL_BODY))
    assert (r.status_code, r.json()["code"]) == (413, "REQUEST_TOO_LARGE")


def test_exec_declaring_512_mib_is_413_before_reading(
    server: PlatformServer, handle: dict[str, Any]
) -> None:
    path = handle["endpoint"].split(str(server.port), 1)[1]
    credential = "".join(f"{k}: {v}\r\n" for k, v in handle["headers"].items())
    answer = head_only(
        server.port,
        f"POST {path}/v1/exec HTTP/1.1\r\nHost: x\r\n{credential}Content-Length: {512 << 20}\r\n",
    )
    assert answer.startswith(b"HTTP/1.1 413 "), answer[:200]
    assert b"REQUEST_TOO_LARGE" in answer


def test_exec_streaming_past_the_limit_is_413(
    server: PlatformServer, handle: dict[str, Any]
) -> None:
    r = server.data(handle, "POST", "/v1/exec", content=chunks(2 * MAX_JSON_BODY))
    assert (r.status_code, r.json()["code"]) == (413, "REQUEST_TOO_LARGE")
    assert server.exec(handle, "true").status_code == 200


def test_native_file_writes_are_not_capped_by_the_json_limit(
    server: PlatformServer, handle: dict[str, Any]
) -> None:
    data = b"z" * (MAX_JSON_BODY + 1024 * 1024)
    r = server.data(
        handle,
        "PUT",
        "/v1/files",
        params={"path": "/workspace/big"},
        headers={"X-Podbay-Sha256": hashlib.sha256(data).hexdigest()},
        content=data,
    )
    assert r.status_code == 200, r.text
    assert r.json()["size"] == len(data)


@pytest.mark.parametrize("framing", ["length", "chunked"])
def test_native_file_write_larger_than_the_disk_is_no_space(
    server: PlatformServer, handle: dict[str, Any], framing: str
) -> None:
    """The agent refuses it (from the head when it has a length) and stops
    reading; the gateway relays that refusal (it answered 502 when the body
    could not all be sent)."""
    size = 96 * 1024 * 1024  # /dev/shm is the sandbox's 64 MiB tmpfs
    length = {"Content-Length": str(size)} if framing == "length" else {}
    r = server.data(
        handle,
        "PUT",
        "/v1/files",
        params={"path": "/dev/shm/too-big"},
        headers={"X-Podbay-Sha256": "0" * 64, **length},
        content=chunks(size),
    )
    assert (r.status_code, r.json()["code"]) == (507, "NO_SPACE")
    listed = server.exec(handle, "ls", "-A", "/dev/shm")
    assert listed.json()["stdout"] == ""


def test_native_file_write_cut_short_by_the_client_leaves_nothing(
    server: PlatformServer, handle: dict[str, Any]
) -> None:
    """A large body (handed from the listener to the relay's splice) whose client
    hangs up half-way: the agent gets a short body and writes nothing, and the
    server goes on answering."""
    url = httpx.URL(handle["endpoint"])
    head = [f"PUT {url.path.rstrip('/')}/v1/files?path=/workspace/cut HTTP/1.1"]
    head += [f"host: {url.host}", f"content-length: {64 * 1024 * 1024}"]
    head += [f"{k}: {v}" for k, v in handle["headers"].items()]
    head += ["x-podbay-sha256: " + "0" * 64, "", ""]
    with socket.create_connection((url.host, url.port), timeout=30) as sock:
        sock.sendall("\r\n".join(head).encode())
        for chunk in chunks(16 * 1024 * 1024):
            sock.sendall(chunk)
    left: list[str] = []
    for _ in range(100):  # the agent sees the cut once the relay lets go
        listed = server.exec(handle, "ls", "-A", "/workspace").json()["stdout"].split()
        left = [name for name in listed if "cut" in name]  # the file or its temporary
        if not left:
            break
        time.sleep(0.1)
    assert left == []
    assert server.exec(handle, "true").status_code == 200
