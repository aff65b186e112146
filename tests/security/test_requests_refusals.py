"""Hostile requests get the contract's 4xx, never a 500 or a 502.

A real ``podbay serve`` with one real sandbox, reused by every case here.
"""

from __future__ import annotations

import hashlib
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from podbay import SandboxClient
from podbay.errors import SandboxRequestError
from podbay.testing.platform import PlatformServer

pytestmark = [pytest.mark.root, pytest.mark.timeout(300)]

DEEP = b"[" * 20_000 + b"]" * 20_000  # under every body limit
NAME = "refusals"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PlatformServer]:
    with PlatformServer.start(tmp_path_factory.mktemp("serve")) as s:
        yield s


@pytest.fixture(scope="module")
def token(server: PlatformServer) -> str:
    return server.create_deployment("hostile")


@pytest.fixture(scope="module")
def handle(server: PlatformServer, token: str) -> dict[str, Any]:
    r = server.attach(token, NAME)
    assert r.status_code == 200, r.text
    return dict(r.json())


def refused(r: Any, status: int, code: str) -> None:
    assert (r.status_code, r.json().get("code")) == (status, code), r.text


# -- deeply nested JSON ----------------------------------------------------------------


def test_deep_json_attach_body_is_400(server: PlatformServer, token: str) -> None:
    r = server.attach(token, NAME, content=DEEP, headers={"content-type": "application/json"})
    refused(r, 400, "REQUEST_INVALID")


@pytest.mark.parametrize(
    ("method", "path", "prefix"),
    [
        ("POST", "/v1/exec", b'{"command":'),
        ("POST", "/v1/processes", b'{"command":'),
        ("POST", "/v1/processes/p-none/signal", b'{"signal":'),
        ("POST", "/v1/files/mkdir", b'{"path":'),
    ],
)
def test_deep_json_agent_bodies_are_400(
    server: PlatformServer, handle: dict[str, Any], method: str, path: str, prefix: bytes
) -> None:
    r = server.data(handle, method, path, content=prefix + DEEP + b"}")
    refused(r, 400, "REQUEST_INVALID")


# -- lone surrogates ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/exec", b'{"command":["true"],"env":{"\\ud800":"x"}}'),
        ("/v1/exec", b'{"command":["true"],"env":{"A":"\\udfff"}}'),
        ("/v1/exec", b'{"command":["echo","\\ud83d"]}'),
        ("/v1/exec", b'{"command":["true"],"cwd":"/tmp/\\ud800"}'),
        ("/v1/exec", b'{"command":["true"],"\\ud800":1}'),
        ("/v1/processes", b'{"command":["true"],"env":{"\\ud800":"x"}}'),
        ("/v1/files/mkdir", b'{"path":"/tmp/\\ud800"}'),
    ],
)
def test_lone_surrogates_are_400(
    server: PlatformServer, handle: dict[str, Any], path: str, body: bytes
) -> None:
    r = server.data(handle, "POST", path, content=body)
    refused(r, 400, "REQUEST_INVALID")


def test_lone_surrogate_in_a_file_path_is_400(
    server: PlatformServer, handle: dict[str, Any]
) -> None:
    r = server.data(handle, "GET", "/v1/files/stat?path=/tmp/%ED%A0%80")
    refused(r, 400, "REQUEST_INVALID")


# -- native writes to what cannot be replaced --------------------------------------------


@pytest.mark.parametrize(
    "path", ["/etc/hosts", "/dev/null", "/etc/resolv.conf", "/sys/kernel/podbay"]
)
def test_native_write_to_special_or_read_only_file_is_409(
    server: PlatformServer, handle: dict[str, Any], path: str
) -> None:
    r = server.data(
        handle,
        "PUT",
        "/v1/files",
        params={"path": path},
        headers={"X-Podbay-Sha256": hashlib.sha256(b"x").hexdigest()},
        content=b"x",
    )
    refused(r, 409, "PATH_ACCESS_DENIED")


# -- an agent body over its limit ----------------------------------------------------------


def test_agent_body_over_8_mib_is_the_agents_413(
    server: PlatformServer, handle: dict[str, Any]
) -> None:
    body = b'{"command":["true"],"cwd":"' + b"a" * (9 * 1024 * 1024) + b'"}'
    r = server.data(handle, "POST", "/v1/exec", content=body)
    refused(r, 413, "REQUEST_TOO_LARGE")
    # The sandbox still answers.
    assert server.exec(handle, "true").status_code == 200


# -- a client that hangs up mid-body -------------------------------------------------------


def _half_sent(port: int, head: str) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(head.encode() + b"\r\n" + b"[" * 1000)
        time.sleep(0.2)


def test_client_dropping_mid_body_logs_no_traceback(
    server: PlatformServer, token: str, handle: dict[str, Any]
) -> None:
    before = server.log_path.read_text()
    endpoint_path = handle["endpoint"].split(str(server.port), 1)[1]
    credential = "".join(f"{k}: {v}\r\n" for k, v in handle["headers"].items())
    for _ in range(2):
        _half_sent(
            server.port,
            f"PUT /api/v1/sandboxes/{NAME} HTTP/1.1\r\nHost: x\r\n"
            f"Authorization: Bearer {token}\r\nContent-Length: 100000\r\n",
        )
        _half_sent(
            server.port,
            f"POST {endpoint_path}/v1/exec HTTP/1.1\r\nHost: x\r\n"
            f"{credential}Content-Length: 100000\r\n",
        )
    time.sleep(1)  # let the server notice
    assert server.attach(token, NAME).status_code == 200
    logged = server.log_path.read_text()[len(before) :]
    assert "Traceback" not in logged, logged


# -- the base64 write path on a full disk -------------------------------------------------


def test_base64_write_to_a_full_disk_is_no_space(
    server: PlatformServer, token: str, handle: dict[str, Any]
) -> None:
    # /dev/shm is the sandbox's small tmpfs: filled in an instant.
    r = server.exec(
        handle,
        "sh",
        "-c",
        "fallocate -l 64M /dev/shm/fill || head -c 64M /dev/zero > /dev/shm/fill; true",
    )
    assert r.status_code == 200, r.text
    try:
        with (
            SandboxClient(identity_token=token, files="base64") as client,
            pytest.raises(SandboxRequestError) as caught,
        ):
            client.write_file_bytes(NAME, "/dev/shm/more", b"x" * 200_000)
        assert (caught.value.status, caught.value.code) == (507, "NO_SPACE")
    finally:
        server.exec(handle, "rm", "-f", "/dev/shm/fill")


def test_server_log_has_no_tracebacks_from_this_module(server: PlatformServer) -> None:
    """Last: nothing above made the server log a bug."""
    text = Path(server.log_path).read_text()
    assert "Traceback" not in text, text[-4000:]
