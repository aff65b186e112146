"""SIGTERM while an exec runs past the shutdown grace (5 s): the client gets
the contract's JSON 503 ``SERVER_SHUTTING_DOWN`` (was a text/plain 500), the
command is killed with its process tree as when any client goes away (the
server's connection to the agent closes), and the SDK re-attaches across the
restart (riding over its connection refusals and 503s) and repeats the call.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from podbay import SandboxClient
from podbay.testing.platform import PlatformServer

pytestmark = [pytest.mark.root, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PlatformServer]:
    with PlatformServer.start(tmp_path_factory.mktemp("serve")) as s:
        yield s


@pytest.fixture(scope="module")
def token(server: PlatformServer) -> str:
    return server.create_deployment("shutdown")


def in_thread(work: Any) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(work())
        except Exception as exc:  # noqa: BLE001 - handed to the test
            out.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def test_exec_past_the_grace_gets_json_503_and_its_command_is_killed(
    server: PlatformServer, token: str
) -> None:
    handle = server.attach(token, "raw").json()
    thread, out = in_thread(
        lambda: httpx.post(
            handle["endpoint"] + "/v1/exec",
            headers=handle["headers"],
            timeout=120,
            json={"command": ["sh", "-c", "sleep 9; echo done > /workspace/done"]},
        )
    )
    started = time.monotonic()
    time.sleep(1.5)  # the exec is in flight
    server.terminate(timeout=60)
    thread.join(60)
    (r,) = out
    assert isinstance(r, httpx.Response), r
    assert r.status_code == 503, r.text
    assert r.headers["content-type"] == "application/json", r.text
    assert r.json()["code"] == "SERVER_SHUTTING_DOWN"
    server.spawn()
    server.wait_ready()
    handle = server.attach(token, "raw").json()
    # Had the command lived on, it would still run (its shell's command line
    # names the sleep) or, 9 s after it began, have written its file: neither.
    listing = server.exec(handle, "sh", "-c", "cat /proc/[0-9]*/cmdline | tr '\\0' ' '")
    seen = listing.json()["stdout"]
    assert "/proc/[0-9]*/cmdline" in seen, seen  # the listing sees its own shell
    assert "sleep 9" not in seen, (time.monotonic() - started, seen)
    assert server.exec(handle, "test", "-e", "/workspace/done").json()["exit_code"] == 1
    assert "Traceback" not in server.log_tail(400)


def test_sdk_rides_over_the_restart_and_repeats(server: PlatformServer, token: str) -> None:
    with SandboxClient(identity_token=token) as client:
        client.attach("sdk")
        # The first run outlasts the 5 s grace; the repeat has no need to.
        script = "echo run >> /workspace/runs; [ $(wc -l < /workspace/runs) -gt 1 ] || sleep 8"
        thread, out = in_thread(lambda: client.exec("sdk", ["sh", "-c", script]))
        time.sleep(1.5)
        server.restart()
        thread.join(120)
        (result,) = out
        assert not isinstance(result, Exception), repr(result)
        assert result.exit_code == 0
        # Documented: the first run began (then was killed); the repeat ran it again.
        runs = client.exec("sdk", ["cat", "/workspace/runs"]).stdout
        assert runs == "run\nrun\n"
