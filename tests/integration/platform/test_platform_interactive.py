"""Terminals and ports through the gateway, over real sandboxes of each OCI class:
a WebSocket PTY running python's REPL, HTTP and WebSocket to servers started in
the sandbox through /v1/ports, and share URLs (valid, expired, forged).

``PODBAY_TEST_INTERACTIVE_CLASSES`` (default ``container,gvisor``) lists the
classes to run it over, e.g. ``container,vm``."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.exceptions import ConnectionClosedError, ConnectionClosedOK, InvalidStatus
from websockets.sync.client import ClientConnection, connect

from podbay.client import AsyncSandboxClient, SandboxClient
from podbay.errors import SandboxRequestError
from podbay.testing.platform import PlatformServer

pytestmark = pytest.mark.root

CLASSES = os.environ.get("PODBAY_TEST_INTERACTIVE_CLASSES", "container,gvisor").split(",")

#: A stdlib-only WebSocket echo server (the sandbox image has no packages):
#: answers each text message upper-cased, with the subprotocol it was offered.
WS_ECHO = r"""
import base64, hashlib, socket, struct, sys
srv = socket.create_server(("127.0.0.1", int(sys.argv[1])))
while True:
    c, _ = srv.accept()
    head = b"x"
    while b"\r\n\r\n" not in head and head:
        data = c.recv(4096)
        head = head + data if data else b""
    if not head:  # a probe: connected and left
        c.close()
        continue
    head = head[1:]
    lines = head.decode().split("\r\n")
    h = {k.lower(): v.strip() for k, _, v in (l.partition(":") for l in lines[1:] if l)}
    acc = base64.b64encode(hashlib.sha1((h["sec-websocket-key"]
        + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest()).decode()
    proto = f"Sec-WebSocket-Protocol: {h['sec-websocket-protocol'].split(',')[0]}\r\n" \
        if "sec-websocket-protocol" in h else ""
    c.sendall(f"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
              f"Connection: Upgrade\r\nSec-WebSocket-Accept: {acc}\r\n{proto}\r\n".encode())
    f = c.makefile("rb")
    while True:
        b0, b1 = f.read(2)
        n = b1 & 127
        if n == 126: n = struct.unpack(">H", f.read(2))[0]
        elif n == 127: n = struct.unpack(">Q", f.read(8))[0]
        mask = f.read(4)
        data = bytes(x ^ mask[i % 4] for i, x in enumerate(f.read(n)))
        if b0 & 15 == 8:
            c.sendall(b"\x88\x02" + data[:2]); c.close(); break
        out = (h["x-forwarded-prefix"] + " " + data.decode().upper()).encode()
        size = bytes([len(out)]) if len(out) < 126 else b"\x7e" + struct.pack(">H", len(out))
        c.sendall(b"\x81" + size + out)
"""


def _ws_url(handle: dict[str, Any], path: str) -> str:
    return handle["endpoint"].replace("http://", "ws://", 1) + path


def _read_until(ws: ClientConnection, needle: bytes) -> bytes:
    seen = b""
    while needle not in seen:
        try:
            message = ws.recv(timeout=60)
        except TimeoutError:
            raise AssertionError(f"no {needle!r} in 60 s; the terminal showed {seen!r}") from None
        assert isinstance(message, bytes), message
        seen += message
    return seen


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PlatformServer]:
    with PlatformServer.start(
        tmp_path_factory.mktemp("serve"), env={"PODBAY_RUNTIME_CLASSES": ",".join(CLASSES)}
    ) as s:
        yield s


@pytest.fixture(scope="module")
def token(server: PlatformServer) -> str:
    return server.create_deployment("interactive")


@pytest.fixture(scope="module", params=CLASSES)
def handle(
    request: pytest.FixtureRequest, server: PlatformServer, token: str
) -> Iterator[dict[str, Any]]:
    name = f"interactive-{request.param}"
    for _ in range(600):
        r = server.attach(token, name, json={"class": request.param})
        if r.status_code != 503:
            break
        time.sleep(1)
    assert r.status_code == 200, r.text
    assert r.json()["class"] == request.param
    yield r.json()
    server.api("DELETE", f"/api/v1/sandboxes/{name}", token)


def test_pty_session_runs_the_python_repl(handle: dict[str, Any]) -> None:
    info = httpx.get(handle["endpoint"] + "/v1/info", headers=handle["headers"]).json()
    assert {"pty", "ports"} <= set(info["features"])
    with connect(_ws_url(handle, "/v1/pty"), additional_headers=handle["headers"]) as ws:
        ws.send(json.dumps({"command": ["python3", "-q", "-i"], "rows": 30, "cols": 90}))
        _read_until(ws, b">>> ")
        ws.send(b"6*7\r")
        assert b"42" in _read_until(ws, b"42")
        ws.send(json.dumps({"type": "resize", "rows": 40, "cols": 120}))
        ws.send(b"import shutil; shutil.get_terminal_size()\r")
        assert b"columns=120, lines=40" in _read_until(ws, b"lines=40")
        ws.send(b"exit(3)\r")
        while isinstance(message := ws.recv(timeout=60), bytes):
            pass
        assert json.loads(message) == {"type": "exit", "exit_code": 3}
        with pytest.raises(ConnectionClosedOK):  # closed by the server, normally
            ws.recv(timeout=10)
        assert ws.close_code == 1000


def test_pty_refusals(handle: dict[str, Any]) -> None:
    for headers, status in (({}, 401), ({"X-Podbay-Credential": "forged"}, 401)):
        with pytest.raises(InvalidStatus) as refused:
            connect(_ws_url(handle, "/v1/pty"), additional_headers=headers)
        assert refused.value.response.status_code == status
        assert b"CREDENTIAL_INVALID" in refused.value.response.body
    with connect(_ws_url(handle, "/v1/pty"), additional_headers=handle["headers"]) as ws:
        ws.send(json.dumps({"command": ["/no/such/program"]}))
        refusal = json.loads(ws.recv(timeout=60))
        assert refusal["code"] == "COMMAND_START_FAILED"
        with pytest.raises(ConnectionClosedError):
            ws.recv(timeout=10)
        assert ws.close_code == 1008


@pytest.fixture(scope="module")
def servers(server: PlatformServer, handle: dict[str, Any]) -> dict[str, int]:
    """An HTTP server and a WebSocket echo server, on the sandbox's loopback."""
    put = server.data(
        handle,
        "PUT",
        "/v1/files",
        params={"path": "ws_echo.py"},
        content=WS_ECHO.encode(),
        headers={"X-Podbay-Sha256": hashlib.sha256(WS_ECHO.encode()).hexdigest()},
    )
    assert put.status_code == 200, put.text
    site = "site"
    assert (
        server.exec(
            handle, "sh", "-c", f"mkdir -p {site} && echo hello from inside > {site}/index.html"
        ).json()["exit_code"]
        == 0
    )
    for argv in (
        ["python3", "-m", "http.server", "8123", "--bind", "127.0.0.1", "--directory", site],
        ["python3", "ws_echo.py", "8124"],
    ):
        r = server.data(handle, "POST", "/v1/processes", json={"command": argv})
        assert r.status_code == 200, r.text
    for port in (8123, 8124):
        for _ in range(200):
            probe = server.exec(
                handle,
                "python3",
                "-c",
                f"import socket; socket.create_connection(('127.0.0.1', {port}))",
            )
            if probe.json()["exit_code"] == 0:
                break
            time.sleep(0.1)
        else:
            raise AssertionError(f"nothing listens on {port} in the sandbox")
    return {"http": 8123, "ws": 8124}


def test_http_through_ports(
    server: PlatformServer, handle: dict[str, Any], servers: dict[str, int]
) -> None:
    r = server.data(handle, "GET", f"/v1/ports/{servers['http']}/index.html")
    assert r.status_code == 200, r.text
    assert r.text == "hello from inside\n", r.text
    assert server.data(handle, "GET", f"/v1/ports/{servers['http']}/nope").status_code == 404
    unauthenticated = server.http.get(handle["endpoint"] + f"/v1/ports/{servers['http']}/")
    assert unauthenticated.status_code == 401
    closed = server.data(handle, "GET", "/v1/ports/8999/")
    assert closed.status_code == 502
    assert closed.json()["code"] == "PORT_UNREACHABLE"
    assert server.data(handle, "GET", "/v1/ports/70000/").status_code == 404


def test_websocket_through_ports(handle: dict[str, Any], servers: dict[str, int]) -> None:
    url = _ws_url(handle, f"/v1/ports/{servers['ws']}/chat")
    with connect(url, additional_headers=handle["headers"], subprotocols=["echo"]) as ws:
        assert ws.subprotocol == "echo"
        ws.send("hello")
        prefix = handle["endpoint"].split("://", 1)[1].split("/", 1)[1]
        assert ws.recv(timeout=60) == f"/{prefix}/v1/ports/{servers['ws']} HELLO"
    with pytest.raises(InvalidStatus) as refused:
        connect(url)
    assert refused.value.response.status_code == 401


def test_websocket_through_a_share_url(
    server: PlatformServer, token: str, handle: dict[str, Any], servers: dict[str, int]
) -> None:
    shared = server.api(
        "POST", f"/api/v1/sandboxes/{handle['name']}/ports/{servers['ws']}/share", token
    ).json()["url"]
    with connect(shared.replace("http://", "ws://", 1) + "chat") as ws:
        ws.send("hi")
        prefix = "/share/" + shared.split("/share/")[1].rstrip("/")
        assert ws.recv(timeout=60) == f"{prefix} HI"


def test_share_urls(
    server: PlatformServer, token: str, handle: dict[str, Any], servers: dict[str, int]
) -> None:
    name = handle["name"]
    path = f"/api/v1/sandboxes/{name}/ports/{servers['http']}/share"
    shared = server.api("POST", path, token, json={"expires_in_seconds": 600})
    assert shared.status_code == 200, shared.text
    url = shared.json()["url"]
    page = httpx.get(url + "index.html")
    assert page.status_code == 200
    assert page.text == "hello from inside\n"
    # Forged: another signature, or another port's claims, is refused.
    _, claims, signature = url.split("/share/")[1].rstrip("/").split(".")
    forged = url.replace(signature, signature[::-1])
    assert httpx.get(forged + "index.html").status_code == 401
    other = server.api(
        "POST", f"/api/v1/sandboxes/{name}/ports/{servers['ws']}/share", token
    ).json()["url"]
    other_claims = other.split("/share/")[1].split(".")[1]
    assert httpx.get(url.replace(claims, other_claims) + "index.html").status_code == 401
    assert server.api("POST", path, None).status_code == 401
    assert server.api("POST", path, token, json={"expires_in_seconds": 0}).status_code == 400
    short = server.api("POST", path, token, json={"expires_in_seconds": 1}).json()["url"]
    time.sleep(2.5)
    expired = httpx.get(short + "index.html")
    assert expired.status_code == 401
    assert "expired" in expired.json()["error"]
    # A share URL is no credential, and a credential no share URL.
    share_token = url.split("/share/")[1].rstrip("/")
    as_credential = server.data(
        handle, "GET", "/v1/info", headers={"X-Podbay-Credential": share_token}
    )
    assert as_credential.status_code == 401
    credential = handle["headers"]["X-Podbay-Credential"]
    assert httpx.get(f"{server.base_url}/share/{credential}/").status_code == 401


def test_sdk_sync_terminal_url_transport_and_share(
    server: PlatformServer, token: str, handle: dict[str, Any], servers: dict[str, int]
) -> None:
    with SandboxClient(identity_token=token, server_url=server.base_url) as client:
        sandbox = client.sandbox(handle["name"])
        with sandbox.pty(["python3", "-q"], rows=20, cols=70) as tty:
            seen = b""
            while b">>> " not in seen:
                seen += tty.recv()
            tty.send("print(6*7)\r")
            tty.resize(25, 99)
            tty.send("import shutil; print(shutil.get_terminal_size())\rexit(5)\r")
            seen = b""
            while chunk := tty.recv():
                seen += chunk
            assert b"42" in seen
            assert b"columns=99, lines=25" in seen
            assert tty.exit_code == 5
        url = sandbox.url(servers["http"], "index.html")
        assert url == f"{handle['endpoint']}/v1/ports/{servers['http']}/index.html"
        with httpx.Client(transport=sandbox.port_transport()) as http:
            assert http.get(url).text == "hello from inside\n"
        shared = sandbox.share_url(servers["http"], expires_in_seconds=60)
        assert httpx.get(shared + "index.html").text == "hello from inside\n"


def test_sdk_async_terminal(
    server: PlatformServer, token: str, handle: dict[str, Any], servers: dict[str, int]
) -> None:
    async def main() -> tuple[bytes, int | None, str]:
        async with AsyncSandboxClient(identity_token=token, server_url=server.base_url) as c:
            sandbox = c.sandbox(handle["name"])
            async with await sandbox.pty(["sh", "-c", "read x; echo got $x; exit 4"]) as tty:
                await tty.send(b"hello\r")
                seen = b""
                while chunk := await tty.recv():
                    seen += chunk
                code = tty.exit_code
            async with httpx.AsyncClient(transport=sandbox.port_transport()) as http:
                page = (await http.get(await sandbox.url(servers["http"]))).text
            return seen, code, page

    seen, code, page = asyncio.run(main())
    assert b"got hello" in seen
    assert code == 4
    assert "index.html" in page or "hello" in page


class Tmux:
    """A tmux server of this test's own (its own socket), driven like a person would."""

    def __init__(self, tmp_path: Path) -> None:
        self.socket = str(tmp_path / "tmux.sock")

    def __call__(self, *args: str) -> str:
        done = subprocess.run(
            ["tmux", "-S", self.socket, *args],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        return done.stdout

    def screen(self) -> str:
        return self("capture-pane", "-p", "-J", "-t", "shell")

    def wait_for(self, text: str, timeout: float = 60) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            screen = self.screen()
            if text in screen:
                return screen
            time.sleep(0.1)
        raise AssertionError(f"{text!r} never showed on the terminal:\n{self.screen()}")


def test_cli_shell_in_tmux(
    server: PlatformServer, token: str, handle: dict[str, Any], tmp_path: Path
) -> None:
    tmux = Tmux(tmp_path)
    status = tmp_path / "status"
    shell = " ".join(
        shlex.quote(a)
        for a in [
            sys.executable,
            "-m",
            "podbay.cli.main",
            "sandbox",
            "shell",
            handle["name"],
            "--server",
            server.base_url,
            "--",
            "python3",
            "-q",
        ]
    )
    tmux(
        "new-session",
        "-d",
        "-s",
        "shell",
        "-x",
        "100",
        "-y",
        "30",
        f"env ASTRO_AUTHZ_TOKEN={token} TERM=xterm {shell}; echo $? > {status}; sleep 60",
    )
    try:
        tmux.wait_for(">>> ")
        tmux("send-keys", "-t", "shell", "6*7", "Enter")
        tmux.wait_for("42")
        tmux("send-keys", "-t", "shell", "import shutil; shutil.get_terminal_size()", "Enter")
        tmux.wait_for("columns=100, lines=30")
        tmux("resize-window", "-t", "shell", "-x", "120", "-y", "40")
        tmux("send-keys", "-t", "shell", "shutil.get_terminal_size()", "Enter")
        tmux.wait_for("columns=120, lines=40")
        # Ctrl-C reaches the program in the sandbox, not the local CLI (under
        # gVisor, whose terminal sends no signal, the agent raises it).
        tmux("send-keys", "-t", "shell", "import time; time.sleep(3600)", "Enter")
        tmux.wait_for("time.sleep(3600)")
        tmux("send-keys", "-t", "shell", "C-c")
        tmux.wait_for("KeyboardInterrupt")
        tmux("send-keys", "-t", "shell", "exit(9)", "Enter")
        deadline = time.monotonic() + 60
        while not (status.exists() and status.read_text().strip()):
            assert time.monotonic() < deadline, tmux.screen()
            time.sleep(0.1)
        assert status.read_text().strip() == "9"
    finally:
        subprocess.run(["tmux", "-S", tmux.socket, "kill-server"], capture_output=True)


def test_terminal_as_another_user(
    server: PlatformServer, token: str, handle: dict[str, Any]
) -> None:
    with SandboxClient(identity_token=token, server_url=server.base_url) as client:
        sandbox = client.sandbox(handle["name"])
        with sandbox.pty(["sh", "-c", "id -un; echo $HOME"], user="user") as tty:
            seen = b""
            while chunk := tty.recv():
                seen += chunk
        assert seen.split() == [b"user", b"/home/user"], seen
        assert tty.exit_code == 0
        with pytest.raises(SandboxRequestError) as refused:
            sandbox.pty(["true"], user="nobody-here").wait()
        assert refused.value.code == "USER_UNKNOWN"


def test_terminal_signals_reach_the_foreground_job(
    server: PlatformServer, token: str, handle: dict[str, Any], tmp_path: Path
) -> None:
    """``podbay sandbox shell`` (bash -l, job control on) as a person uses it:
    Ctrl-C ends the foreground ``sleep`` and the prompt comes back, Ctrl-Z stops
    one (bash reports it), Ctrl-\\ quits one; the shell itself lives on."""
    tmux = Tmux(tmp_path)
    shell = " ".join(
        shlex.quote(a)
        for a in [
            sys.executable,
            "-m",
            "podbay.cli.main",
            "sandbox",
            "shell",
            handle["name"],
            "--server",
            server.base_url,
        ]
    )
    tmux(
        "new-session",
        "-d",
        "-s",
        "shell",
        "-x",
        "100",
        "-y",
        "30",
        f"env ASTRO_AUTHZ_TOKEN={token} TERM=xterm {shell}; sleep 60",
    )
    try:
        tmux.wait_for("/workspace# ")  # bash's own prompt: it reads what is typed now
        tmux("send-keys", "-t", "shell", "PS1='ready> '", "Enter")
        tmux.wait_for("ready> ")
        for key, echo in (("C-c", "^C"), ("C-\\", "^\\"), ("C-z", "^Z")):
            tmux("send-keys", "-t", "shell", "clear", "Enter")
            tmux.wait_for("ready> ")
            tmux("send-keys", "-t", "shell", "sleep 100", "Enter")
            # The sleep runs once the shell waits for it: ps sees it in the sandbox.
            deadline = time.monotonic() + 60
            while "sleep 100" not in server.exec(handle, "ps", "-e", "-o", "args=").text:
                assert time.monotonic() < deadline, tmux.screen()
                time.sleep(0.1)
            tmux("send-keys", "-t", "shell", key)
            # The prompt comes back (not after the sleep's 100 s), after the echo.
            deadline = time.monotonic() + 20
            while tmux.screen().count("ready> ") < 2:
                assert time.monotonic() < deadline, tmux.screen()
                time.sleep(0.1)
            assert echo in tmux.screen(), tmux.screen()
        assert "Stopped" in tmux.screen()  # bash's word for the job Ctrl-Z stopped
        tmux("send-keys", "-t", "shell", "kill %1; echo alive", "Enter")
        tmux.wait_for("alive")
    finally:
        subprocess.run(["tmux", "-S", tmux.socket, "kill-server"], capture_output=True)
