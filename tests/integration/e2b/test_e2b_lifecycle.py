"""E2B's SDKs (``e2b``, ``e2b-code-interpreter``) against a real ``podbay
serve``: ``get_host(port)``, templates by E2B name (the code interpreter's
default among them), the lifecycle (auto-pause at the timeout, resume on
connect or on traffic) and the same sandboxes through podbay's own SDK. One
server per class for the module."""

from __future__ import annotations

import asyncio
import base64
import http.client
import re
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from podbay.client import SandboxClient
from podbay.testing.platform import SANDBOX_SPEC, PlatformServer

e2b = pytest.importorskip("e2b")
ci = pytest.importorskip("e2b_code_interpreter")

pytestmark = pytest.mark.root

#: A server in the sandbox that get_host reaches: serves /tmp on port 8080.
SERVE = "cd /tmp && exec python3 -m http.server 8080 --bind 127.0.0.1"


@pytest.fixture(scope="module")
def server(e2b_server: PlatformServer) -> PlatformServer:
    """One ``podbay serve`` per class (``conftest.py``: its layers are in the
    machine's shared directory, so code-interpreter-v1's is built once)."""
    return e2b_server


def _created(server: PlatformServer, name: str, spec: str = SANDBOX_SPEC) -> tuple[str, str]:
    """(identity token, E2B key) of a new deployment."""
    out = server.cli("deployment", "create", name, "--spec", "-", "--e2b-key", input=spec)
    lines = out.stdout.strip().splitlines()
    return lines[-2], lines[-1]


@pytest.fixture(scope="module")
def keys(server: PlatformServer) -> tuple[str, str]:
    return _created(server, "e2b-life")


def _opts(server: PlatformServer, key: str) -> dict[str, Any]:
    return {"api_key": key, "api_url": server.base_url, "sandbox_url": server.base_url}


def _through_host(
    server: PlatformServer, host: str, token: str | None, path: str = "/"
) -> httpx.Response:
    """A request to ``get_host``'s address: sent to the server, ``Host`` naming
    it (what a resolver for ``*.localhost`` or a wildcard DNS name does)."""
    headers = {"Host": host}
    if token is not None:
        headers["E2B-Traffic-Access-Token"] = token
    return httpx.get(server.base_url + path, headers=headers, timeout=30)


def _wait_served(server: PlatformServer, host: str, token: str) -> httpx.Response:
    while True:  # until the server in the sandbox listens; pytest's timeout bounds this
        answer = _through_host(server, host, token, "/hello.txt")
        if answer.status_code != 502:
            return answer
        time.sleep(0.2)


@pytest.mark.parametrize("e2b_server", ["gvisor", "container", "vm"], indirect=True)
def test_get_host_reaches_a_server_in_the_sandbox(server: PlatformServer, keys: Any) -> None:
    sandbox = e2b.Sandbox.create(**_opts(server, keys[1]))
    other = e2b.Sandbox.create(**_opts(server, keys[1]))
    try:
        sandbox.files.write("/tmp/hello.txt", "hello from the sandbox\n")
        sandbox.commands.run(SERVE, background=True)
        host = sandbox.get_host(8080)
        port = server.base_url.rsplit(":", 1)[1]
        assert host == f"8080-{sandbox.sandbox_id}.localhost:{port}"
        answer = _wait_served(server, host, sandbox.traffic_access_token)
        assert (answer.status_code, answer.text) == (200, "hello from the sandbox\n")
        # X-Access-Token (the envd token the SDK holds) is as good.
        assert httpx.get(
            server.base_url + "/hello.txt",
            headers={"Host": host, "X-Access-Token": sandbox._envd_access_token},
        ).text == ("hello from the sandbox\n")
        # Refused: no token, a wrong one, another sandbox's.
        for token in (None, "x" * 64, other.traffic_access_token):
            refused = _through_host(server, host, token, "/hello.txt")
            assert refused.status_code == 401, refused.text
            assert refused.json()["code"] == 401
            assert "hello" not in refused.text
        # Dot segments would leave the port's path on the data plane: refused.
        raw = http.client.HTTPConnection(server.base_url.removeprefix("http://"), timeout=30)
        raw.request(
            "GET",
            "/../../exec",
            headers={"Host": host, "E2B-Traffic-Access-Token": sandbox.traffic_access_token},
        )
        escaped = raw.getresponse()
        assert escaped.status == 400
        assert b"REQUEST_INVALID" in escaped.read()
        raw.close()
        # A port nothing listens on: the port proxy's refusal, not a 500.
        closed = _through_host(server, sandbox.get_host(8081), sandbox.traffic_access_token)
        assert closed.status_code == 502
        assert closed.json()["code"] == "PORT_UNREACHABLE"
    finally:
        sandbox.kill()
        other.kill()


def test_async_get_host(server: PlatformServer, keys: Any) -> None:
    async def main() -> None:
        sandbox = await e2b.AsyncSandbox.create(**_opts(server, keys[1]))
        try:
            await sandbox.files.write("/tmp/hello.txt", "async hello\n")
            await sandbox.commands.run(SERVE, background=True)
            host = sandbox.get_host(8080)
            answer = await asyncio.to_thread(
                _wait_served, server, host, sandbox.traffic_access_token
            )
            assert (answer.status_code, answer.text) == (200, "async hello\n")
            refused = await asyncio.to_thread(_through_host, server, host, None)
            assert refused.status_code == 401
        finally:
            await sandbox.kill()

    asyncio.run(main())


#: A figure, and the three packages E2B's code-interpreter image has.
PYDATA_CELL = """\
import matplotlib.pyplot as plt
import numpy, pandas
frame = pandas.DataFrame({"x": numpy.arange(3)})
plt.plot(frame["x"], frame["x"] ** 2)
plt.show()
int(frame["x"].sum())
"""


def _is_png(result: Any) -> bool:
    return result.png is not None and base64.b64decode(result.png).startswith(b"\x89PNG")


def test_code_interpreter_default_template_has_pandas_numpy_matplotlib(
    server: PlatformServer, keys: Any
) -> None:
    # No template: the SDK asks for code-interpreter-v1. A cold layer build
    # outlasts the SDK's 60 s: podbay holds the create, then asks the SDK to
    # retry (Should-Retry), so a longer request_timeout and retries carry it.
    sandbox = ci.Sandbox.create(**_opts(server, keys[1]), request_timeout=900, retries=100)
    try:
        assert sandbox.get_info().template_id == "code-interpreter-v1"
        execution = sandbox.run_code(PYDATA_CELL)
        assert execution.error is None, execution.error
        assert execution.text == "3"
        assert any(_is_png(r) for r in execution.results)
    finally:
        sandbox.kill()

    async def main() -> None:
        sandbox = await ci.AsyncSandbox.create(**_opts(server, keys[1]))  # built now
        try:
            execution = await sandbox.run_code(PYDATA_CELL)
            assert execution.error is None
            assert execution.text == "3"
        finally:
            await sandbox.kill()

    asyncio.run(main())


def test_templates_by_name(server: PlatformServer, keys: Any) -> None:
    marked = "name: e2b-tpl-marked\nsandbox:\n  toolchain: never\n  env:\n    MARK: declared\n"
    _created(server, "e2b-tpl-marked", marked)
    opts = _opts(server, keys[1])
    sandbox = e2b.Sandbox.create(template="e2b-tpl-marked", **opts)
    try:
        assert sandbox.commands.run("echo $MARK").stdout == "declared\n"
        assert sandbox.get_info().template_id == "e2b-tpl-marked"
    finally:
        sandbox.kill()
    # Unknown, and another account's deployment: E2B's 404 naming it.
    out = server.cli(
        "deployment",
        "create",
        "e2b-tpl-other",
        "--spec",
        "-",
        "--account",
        "someone-else",
        input=marked.replace("e2b-tpl-marked", "e2b-tpl-other"),
    )
    assert out.returncode == 0
    for template in ("no-such-template", "e2b-tpl-other"):
        with pytest.raises(e2b.SandboxException) as refused:
            e2b.Sandbox.create(template=template, **opts)
        assert "404" in str(refused.value)
        assert template in str(refused.value)


def _listed(server: PlatformServer, key: str, state: Any) -> list[str]:
    query = e2b.SandboxQuery(state=[state])
    return [s.sandbox_id for s in e2b.Sandbox.list(query=query, **_opts(server, key)).next_items()]


def test_auto_pause_at_the_timeout_then_connect_resumes(server: PlatformServer, keys: Any) -> None:
    opts = _opts(server, keys[1])
    sandbox = e2b.Sandbox.create(lifecycle={"on_timeout": "pause"}, **opts)
    try:
        assert sandbox.get_info().lifecycle == {"on_timeout": "pause", "auto_resume": True}
        sandbox.commands.run("echo kept > /tmp/kept")
        sandbox.commands.run("sleep 1000", background=True)
        # The timeout from now on, the setup done (a load-slowed setup would
        # otherwise be paused under its own commands).
        sandbox.set_timeout(1)
        while sandbox.sandbox_id not in _listed(server, keys[1], e2b.SandboxState.PAUSED):
            time.sleep(0.2)  # the sweep pauses it past endAt; pytest's timeout bounds this
        assert sandbox.sandbox_id not in _listed(server, keys[1], e2b.SandboxState.RUNNING)
        time.sleep(1.5)  # past another sweep: still paused, not killed
        assert sandbox.sandbox_id in _listed(server, keys[1], e2b.SandboxState.PAUSED)

        resumed = e2b.Sandbox.connect(sandbox.sandbox_id, timeout=120, **opts)
        assert sandbox.sandbox_id in _listed(server, keys[1], e2b.SandboxState.RUNNING)
        info = resumed.get_info()
        assert (info.end_at - datetime.now(UTC)).total_seconds() > 100  # connect's timeout
        # Memory and files kept: the background command still runs.
        ran = resumed.commands.run("cat /tmp/kept; pgrep -x sleep >/dev/null && echo up")
        assert ran.stdout == "kept\nup\n"
    finally:
        sandbox.kill()


def test_traffic_resumes_a_paused_sandbox(server: PlatformServer, keys: Any) -> None:
    async def main() -> None:
        opts = _opts(server, keys[1])
        sandbox = await e2b.AsyncSandbox.create(**opts)
        try:
            await sandbox.files.write("/tmp/kept", "kept\n")
            await sandbox.pause()
            paused = await asyncio.to_thread(_listed, server, keys[1], e2b.SandboxState.PAUSED)
            assert sandbox.sandbox_id in paused
            # A command reaches it: podbay resumes it (autoResume), timeout reset.
            assert (await sandbox.commands.run("cat /tmp/kept")).stdout == "kept\n"
            assert await sandbox.is_running()
            again = await e2b.AsyncSandbox.connect(sandbox.sandbox_id, **opts)
            assert (await again.files.read("/tmp/kept")) == "kept\n"
        finally:
            await sandbox.kill()

    asyncio.run(main())


@pytest.mark.parametrize("e2b_server", ["gvisor", "container", "vm"], indirect=True)
def test_the_same_sandboxes_through_both_apis(server: PlatformServer, keys: Any) -> None:
    token, key = keys
    opts = _opts(server, key)
    with SandboxClient(identity_token=token, server_url=server.base_url) as podbay:
        # Made through podbay's SDK: listed, connected and used through E2B's.
        podbay.attach("made-by-podbay", labels={"via": "podbay"})
        try:
            # As `user`, E2B's default account, so E2B's calls may overwrite it.
            podbay.exec("made-by-podbay", ["sh", "-c", "echo native > /tmp/who"], user="user")
            listed = e2b.Sandbox.list(query=e2b.SandboxQuery(metadata={"via": "podbay"}), **opts)
            assert [s.sandbox_id for s in listed.next_items()] == ["made-by-podbay"]
            sandbox = e2b.Sandbox.connect("made-by-podbay", **opts)
            assert sandbox.commands.run("cat /tmp/who").stdout == "native\n"
            sandbox.files.write("/tmp/who", "e2b\n")
            assert podbay.exec("made-by-podbay", ["cat", "/tmp/who"]).stdout == "e2b\n"
            # Suspended through podbay's API: E2B's next call resumes it (the
            # server's remembered attach of it is stale and not used).
            podbay.stop("made-by-podbay")
            assert sandbox.commands.run("cat /tmp/who").stdout == "e2b\n"
        finally:
            podbay.delete("made-by-podbay")
        assert "made-by-podbay" not in [s.sandbox_id for s in e2b.Sandbox.list(**opts).next_items()]

        # Made through E2B's: listed and used through podbay's SDK.
        made = e2b.Sandbox.create(**opts)
        try:
            made.files.write("/tmp/who", "from e2b\n")
            assert made.sandbox_id in [s.name for s in podbay.list()]
            assert podbay.exec(made.sandbox_id, ["cat", "/tmp/who"]).stdout == "from e2b\n"
        finally:
            made.kill()
        assert made.sandbox_id not in [s.name for s in podbay.list()]


def _sdk_calls() -> list[tuple[str, str]]:
    """Every (method, path) of E2B's REST API that the pinned SDK can call,
    read from its generated client (one module per call), path parameters
    filled with a sandbox-id-shaped word."""
    root = Path(e2b.__file__).parent / "api" / "client" / "api"
    calls = set()
    for module in root.glob("*/*.py"):
        source = module.read_text()
        method = re.search(r'"method": "(\w+)"', source)
        url = re.search(r'"url": f?"([^"]+)"', source)
        if method and url:
            calls.add((method.group(1).upper(), re.sub(r"\{\w+\}", "a" * 20, url.group(1))))
    return sorted(calls)


def test_every_call_of_the_sdk_answers_in_e2b_shape(server: PlatformServer, keys: Any) -> None:
    calls = _sdk_calls()
    assert ("POST", "/sandboxes/" + "a" * 20 + "/fork") in calls
    assert len(calls) > 40
    for method, path in calls:
        answer = server.http.request(method, path, headers={"X-API-Key": keys[1]}, json={})
        assert answer.status_code < 500 or answer.status_code == 501, (method, path, answer.text)
        if answer.status_code >= 400:
            body = answer.json()
            assert body["code"] == answer.status_code, (method, path, body)
            assert body["message"], (method, path, body)
        if answer.status_code == 501:
            assert "not implemented by podbay" in body["message"]
