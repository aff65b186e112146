"""What a server inside a sandbox answers through ``/v1/ports`` is hostile.

Seen before: an answer that declared ``Content-Length: 1000`` and closed
after 10 bytes reached the client as a clean 200 with 10 bytes; a
``Location:`` to another site was passed on, on the platform's origin.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from podbay.testing.platform import PlatformServer

pytestmark = [pytest.mark.root, pytest.mark.timeout(300)]

PORT = 8125
#: A stdlib server (the sandbox image has no packages): /short declares 1000
#: bytes and sends 10; /go?to=X redirects to X; anything else is a whole answer.
SERVER = r"""
import socket, sys, urllib.parse
srv = socket.create_server(("127.0.0.1", int(sys.argv[1])))
while True:
    c, _ = srv.accept()
    head = b""
    while b"\r\n\r\n" not in head:
        data = c.recv(4096)
        if not data:
            break
        head += data
    target = head.split(b" ")[1].decode() if head.count(b" ") >= 2 else "/"
    url = urllib.parse.urlsplit(target)
    if url.path == "/short":
        c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n0123456789")
    elif url.path == "/go":
        to = urllib.parse.parse_qs(url.query)["to"][0]
        c.sendall(f"HTTP/1.1 302 Found\r\nLocation: {to}\r\nContent-Length: 0\r\n\r\n".encode())
    else:
        c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nwhole")
    c.close()
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PlatformServer]:
    with PlatformServer.start(tmp_path_factory.mktemp("serve")) as s:
        yield s


@pytest.fixture(scope="module")
def handle(server: PlatformServer) -> dict[str, Any]:
    token = server.create_deployment("port-answers")
    r = server.attach(token, "port-answers")
    assert r.status_code == 200, r.text
    handle = dict(r.json())
    put = server.data(
        handle,
        "PUT",
        "/v1/files",
        params={"path": "srv.py"},
        content=SERVER.encode(),
        headers={"X-Podbay-Sha256": hashlib.sha256(SERVER.encode()).hexdigest()},
    )
    assert put.status_code == 200, put.text
    r = server.data(
        handle, "POST", "/v1/processes", json={"command": ["python3", "srv.py", str(PORT)]}
    )
    assert r.status_code == 200, r.text
    probe = f"import socket; socket.create_connection(('127.0.0.1', {PORT}))"
    for _ in range(200):
        if server.exec(handle, "python3", "-c", probe).json()["exit_code"] == 0:
            return handle
        time.sleep(0.1)
    raise AssertionError("the server in the sandbox did not start")


def test_a_short_body_drops_the_connection(server: PlatformServer, handle: dict[str, Any]) -> None:
    whole = server.data(handle, "GET", f"/v1/ports/{PORT}/whole")
    assert whole.status_code == 200
    assert whole.text == "whole"
    with pytest.raises(httpx.RemoteProtocolError):
        server.data(handle, "GET", f"/v1/ports/{PORT}/short")
    # The server goes on serving others.
    assert server.data(handle, "GET", f"/v1/ports/{PORT}/whole").text == "whole"
    assert "Traceback" not in server.log_path.read_text()


@pytest.mark.parametrize(
    ("to", "expected"),
    [
        ("https://evil.example/phish", None),
        ("//evil.example/phish", None),
        ("/\\evil.example/phish", None),
        ("javascript:alert(1)", None),
        ("/login?next=%2F", "{prefix}/login?next=%2F"),
        ("../../../../../api/v1/sandboxes", "{prefix}/api/v1/sandboxes"),
        ("sibling", "{prefix}/sibling"),
        (f"http://localhost:{PORT}/inside", "{prefix}/inside"),
        ("{origin}{prefix}/kept", "{origin}{prefix}/kept"),
        ("{origin}/api/v1/sandboxes", None),
    ],
)
def test_redirects_stay_in_the_sandbox(
    server: PlatformServer, handle: dict[str, Any], to: str, expected: str | None
) -> None:
    prefix = handle["endpoint"].removeprefix(server.base_url) + f"/v1/ports/{PORT}"
    fill = {"origin": server.base_url, "prefix": prefix}
    r = server.data(handle, "GET", f"/v1/ports/{PORT}/go", params={"to": to.format(**fill)})
    assert r.status_code == 302
    assert r.headers.get("location") == (None if expected is None else expected.format(**fill))
