"""WebSockets to a server inside a real sandbox, through both ways in: podbay's
``/v1/ports/{port}/`` path (with the ``websockets`` client) and E2B's
``get_host(port)`` address (``<port>-<sandboxId>.<domain>``, with the E2B SDK's
sandbox and its traffic token). The server is ``ws_echo_server.py``, stdlib
only, started in the sandbox.

One ``podbay serve`` per class (``container``, ``gvisor``), with small bounds
so each shows: 3 WebSockets per sandbox, 8 s idle (the upgrade must be
answered within 7 s, a constant)."""

from __future__ import annotations

import hashlib
import json
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect

from podbay.testing.platform import PlatformServer, e2b_key

e2b = pytest.importorskip("e2b")

pytestmark = [pytest.mark.root, pytest.mark.timeout(600)]

PORT = 8131
LOG = "/tmp/ws.log"
SERVER = (Path(__file__).parent / "ws_echo_server.py").read_text()
CAP = 3
IDLE_SECONDS = 8
#: gateway/app.py's WEBSOCKET_HANDSHAKE_SECONDS.
HANDSHAKE_SECONDS = 7
#: Under the 1 MiB a message may be, either way.
LARGE = 900_000


@pytest.fixture(scope="module", params=["container", "gvisor"])
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[PlatformServer]:
    with PlatformServer.start(
        tmp_path_factory.mktemp("port-ws"),
        env={
            "PODBAY_RUNTIME_CLASSES": request.param,
            "PODBAY_SERVER_SANDBOX_WEBSOCKETS": str(CAP),
            "PODBAY_SERVER_PORT_WEBSOCKET_IDLE_SECONDS": str(IDLE_SECONDS),
        },
    ) as s:
        yield s


@dataclass
class Way:
    """One way in to the echo server of one sandbox."""

    name: str
    #: Opens a WebSocket to the path; ``credentials=False``: without any.
    open: Callable[..., ClientConnection]
    #: The server's log (``open``/``end`` lines).
    log: Callable[[], str]

    def wait_logged(self, line: str) -> None:
        while line not in self.log():  # an event in the sandbox; pytest's timeout bounds it
            time.sleep(0.2)


def _podbay_way(server: PlatformServer) -> Way:
    token = server.create_deployment("port-ws")
    r = server.attach(token, "port-ws")
    assert r.status_code == 200, r.text
    handle: dict[str, Any] = r.json()
    put = server.data(
        handle,
        "PUT",
        "/v1/files",
        params={"path": "/tmp/ws_echo_server.py"},
        content=SERVER.encode(),
        headers={"X-Podbay-Sha256": hashlib.sha256(SERVER.encode()).hexdigest()},
    )
    assert put.status_code == 200, put.text
    command = ["python3", "/tmp/ws_echo_server.py", str(PORT), LOG]
    r = server.data(handle, "POST", "/v1/processes", json={"command": command})
    assert r.status_code == 200, r.text
    base = handle["endpoint"].replace("http://", "ws://", 1) + f"/v1/ports/{PORT}"

    def open_(path: str, credentials: bool = True, **kw: Any) -> ClientConnection:
        kw.setdefault("additional_headers", handle["headers"] if credentials else {})
        return connect(base + path, open_timeout=60, **kw)

    def log() -> str:
        out = server.exec(handle, "sh", "-c", f"cat {LOG} 2>/dev/null; true").json()
        return str(out["stdout"])

    return Way("podbay", open_, log)


def _e2b_way(server: PlatformServer) -> tuple[Way, Any]:
    opts = {
        "api_key": e2b_key(server, "port-ws-e2b"),
        "api_url": server.base_url,
        "sandbox_url": server.base_url,
    }
    sandbox = e2b.Sandbox.create(timeout=3600, **opts)
    sandbox.files.write("/tmp/ws_echo_server.py", SERVER)
    sandbox.commands.run(f"python3 /tmp/ws_echo_server.py {PORT} {LOG}", background=True)
    host = sandbox.get_host(PORT)
    assert host.startswith(f"{PORT}-{sandbox.sandbox_id}.")
    address = urlsplit(server.base_url)

    def open_(path: str, credentials: bool = True, **kw: Any) -> ClientConnection:
        token = {"E2B-Traffic-Access-Token": sandbox.traffic_access_token}
        kw.setdefault("additional_headers", token if credentials else {})
        # get_host's name, as a wildcard DNS name would resolve it: to this server.
        sock = socket.create_connection((address.hostname, address.port))
        return connect(f"ws://{host}{path}", sock=sock, open_timeout=60, **kw)

    def log() -> str:
        return str(sandbox.commands.run(f"cat {LOG} 2>/dev/null; true").stdout)

    return Way("e2b", open_, log), sandbox


@pytest.fixture(scope="module")
def ways(server: PlatformServer) -> Iterator[dict[str, Way]]:
    podbay = _podbay_way(server)
    e2b_way, sandbox = _e2b_way(server)
    found = {"podbay": podbay, "e2b": e2b_way}
    for way in found.values():
        while True:  # until the server in the sandbox listens
            try:
                way.open("/probe").close()
                break
            except InvalidStatus as exc:
                if exc.response.status_code != 502:
                    raise
                time.sleep(0.2)
    yield found
    sandbox.kill()


@pytest.fixture(params=["podbay", "e2b"])
def way(request: pytest.FixtureRequest, ways: dict[str, Way]) -> Way:
    return ways[request.param]


def _refusal(exc: InvalidStatus) -> tuple[int, dict[str, Any]]:
    return exc.response.status_code, json.loads(exc.response.body or b"{}")


def _code(body: dict[str, Any]) -> str:
    """The error's code: podbay's ``code``, E2B's ``error_code``."""
    return str(body.get("error_code") or body.get("code"))


def test_text_binary_fragmented_and_large_messages_echo(way: Way) -> None:
    with way.open("/echo") as ws:
        ws.send("hello")
        assert ws.recv(timeout=60) == "hello"
        ws.send(b"\x00\xffbinary")
        assert ws.recv(timeout=60) == b"\x00\xffbinary"
        ws.send(["frag", "mented"])  # one message in two frames
        assert ws.recv(timeout=60) == "fragmented"
        ws.send(b"\x01" * LARGE)
        assert ws.recv(timeout=60) == b"\x01" * LARGE
        ws.send("t" * LARGE)
        assert ws.recv(timeout=60) == "t" * LARGE
        ws.send(f"big {LARGE}")
        assert ws.recv(timeout=60) == b"x" * LARGE


def test_a_message_over_the_bound_closes_with_1009(way: Way) -> None:
    """Either way: the client's (uvicorn's bound) and the server's (the gateway's)."""
    with way.open("/up", max_size=None) as ws:
        ws.send(b"\x02" * (2 * 1024 * 1024))
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=60)
        assert closed.value.rcvd is not None
        assert closed.value.rcvd.code == 1009
    with way.open("/down", max_size=None) as ws:
        ws.send(f"big {2 * 1024 * 1024}")
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=60)
        assert closed.value.rcvd is not None
        assert closed.value.rcvd.code == 1009
    # The server was told (a close 1009), or, still sending, had its connection
    # closed under it.
    way.wait_logged("end /down ")


def test_close_from_each_side(way: Way) -> None:
    with way.open("/client-closes") as ws:
        ws.send("hi")
        assert ws.recv(timeout=60) == "hi"
        ws.close(4000, "done")
    way.wait_logged("end /client-closes close 4000")
    with way.open("/server-closes") as ws:
        ws.send("close-me")
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=60)
        assert closed.value.rcvd is not None
        assert (closed.value.rcvd.code, closed.value.rcvd.reason) == (4001, "bye")


def test_a_client_that_vanishes_closes_the_servers_side(way: Way) -> None:
    ws = way.open("/vanish")
    ws.send("hi")
    assert ws.recv(timeout=60) == "hi"
    # No close frame: the TCP connection just ends.
    ws.socket.shutdown(socket.SHUT_RDWR)
    ws.socket.close()
    way.wait_logged("end /vanish close 1001")


def test_refused_without_credentials(way: Way, ways: dict[str, Way]) -> None:
    with pytest.raises(InvalidStatus) as refused:
        way.open("/nocred", credentials=False)
    status, body = _refusal(refused.value)
    assert status == 401, body
    # Nothing reached the server in the sandbox.
    assert "open /nocred" not in way.log()


def test_a_wrong_credential_is_refused(server: PlatformServer, ways: dict[str, Way]) -> None:
    """Another sandbox's credential, on either way: refused as for HTTP."""
    token = server.create_deployment("port-ws-other")
    other = server.attach(token, "port-ws-other").json()
    podbay = ways["podbay"]
    with pytest.raises(InvalidStatus) as refused:
        podbay.open("/wrong", credentials=False, additional_headers=other["headers"])
    status, body = _refusal(refused.value)
    assert (status, _code(body)) == (403, "CREDENTIAL_WRONG_SANDBOX")
    with pytest.raises(InvalidStatus) as refused:
        ways["e2b"].open(
            "/wrong",
            credentials=False,
            additional_headers={"E2B-Traffic-Access-Token": "not-the-token"},
        )
    status, body = _refusal(refused.value)
    assert (status, _code(body)) == (401, "E2B_ACCESS_TOKEN_INVALID")
    for way in ways.values():
        assert "open /wrong" not in way.log()
    server.api("DELETE", "/api/v1/sandboxes/port-ws-other", token)


def test_an_upgrade_never_answered_is_a_clear_502(way: Way) -> None:
    with pytest.raises(InvalidStatus) as refused:
        way.open("/silent")
    status, body = _refusal(refused.value)
    assert status == 502, body
    assert _code(body) == "PORT_UNREACHABLE"
    assert f"within {HANDSHAKE_SECONDS} s" in json.dumps(body)
    way.wait_logged("end /silent eof")  # and the server's connection is closed


def test_the_per_sandbox_cap(way: Way) -> None:
    held = [way.open(f"/cap{i}") for i in range(CAP)]
    with pytest.raises(InvalidStatus) as refused:
        way.open("/over")
    status, body = _refusal(refused.value)
    assert status == 429, body
    assert _code(body) == "SANDBOX_BUSY"
    for ws in held[1:]:  # the open ones still work
        ws.send("still")
        assert ws.recv(timeout=60) == "still"
    held[0].close()
    way.wait_logged("end /cap0 close 1000")
    while True:  # the slot comes back once the relay has ended
        try:
            again = way.open("/again")
            break
        except InvalidStatus as exc:
            if exc.response.status_code != 429:
                raise
            time.sleep(0.2)
    again.send("in")
    assert again.recv(timeout=60) == "in"
    for ws in [again, *held[1:]]:
        ws.close()


def test_an_idle_websocket_is_closed_both_ways(way: Way) -> None:
    with way.open("/idle") as ws:
        ws.send("once")
        assert ws.recv(timeout=60) == "once"
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=120)  # nothing more either way
        assert closed.value.rcvd is not None
        assert (closed.value.rcvd.code, closed.value.rcvd.reason) == (1001, "idle")
    way.wait_logged("end /idle close 1001")
