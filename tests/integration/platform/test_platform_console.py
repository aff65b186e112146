"""The web console's server side against a real ``podbay serve`` with real
sandboxes: the page and its CSP, sign-in and its cookie, CSRF and cross-site
refusals, a deployment session kept to its deployment, the operator's API,
the data plane through the console (files, exec, processes, the terminal)
and the live stream."""

from __future__ import annotations

import hashlib
import http.client
import json
import re
import threading
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest

from podbay.console.static import STATIC
from podbay.testing.console import run_in_terminal, terminal_refused, terminal_url
from podbay.testing.platform import PlatformServer

pytestmark = pytest.mark.root


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PlatformServer]:
    with PlatformServer.start(tmp_path_factory.mktemp("serve")) as s:
        yield s


@pytest.fixture(scope="module")
def operator(server: PlatformServer) -> str:
    return server.cli("admin", "token").stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def tokens(server: PlatformServer) -> dict[str, str]:
    return {name: server.create_deployment(name) for name in ("console-a", "console-b")}


#: Every browser-like client a test made, closed after it (their sockets
#: would otherwise be left to the collector: a ResourceWarning, an error here).
_OPEN: list[httpx.Client] = []


@pytest.fixture(autouse=True)
def _close_browsers() -> Iterator[None]:
    yield
    while _OPEN:
        _OPEN.pop().close()


def _browser(server: PlatformServer) -> httpx.Client:
    """A client that keeps cookies, as a browser on the console's page does."""
    client = httpx.Client(base_url=server.base_url, timeout=60, headers={"Origin": server.base_url})
    _OPEN.append(client)
    return client


def _sign_in(server: PlatformServer, token: str) -> tuple[httpx.Client, dict[str, Any]]:
    client = _browser(server)
    r = client.post("/console/session", json={"token": token})
    assert r.status_code == 200, r.text
    return client, r.json()


def _attach(server: PlatformServer, token: str, name: str) -> dict[str, Any]:
    for _ in range(600):
        r = server.attach(token, name)
        if r.status_code != 503:
            break
        time.sleep(1)
    assert r.status_code == 200, r.text
    return dict(r.json())


def _raw_get(server: PlatformServer, target: str, session: str) -> tuple[int, bytes]:
    """A GET of ``target`` exactly as written (no client-side path resolution)."""
    parts = urlsplit(server.base_url)
    conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=60)
    try:
        conn.request("GET", target, headers={"Cookie": f"podbay_session={session}"})
        answer = conn.getresponse()
        return answer.status, answer.read()
    finally:
        conn.close()


def test_page_has_a_strict_csp(server: PlatformServer) -> None:
    assert (STATIC / "index.html").is_file(), "./run builds the console first"
    for path in ("/", "/console", "/console/app/sandboxes/x", "/console/app/nodes"):
        r = server.http.get(path)
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/html")
        csp = r.headers["content-security-policy"]
        for rule in (
            "default-src 'self'",
            "script-src 'self'",
            "object-src 'none'",
            "base-uri 'none'",
            "frame-ancestors 'none'",
        ):
            assert rule in csp
        assert "unsafe-inline" not in csp
        assert r.headers["x-content-type-options"] == "nosniff"
        script = re.search(r'<script[^>]* src="(/console/assets/[^"]+)"', r.text)
        assert script is not None, r.text
        assert "<script>" not in r.text
        assert " style=" not in r.text
    js = server.http.get(script.group(1))
    assert js.status_code == 200
    assert js.headers["content-type"].startswith("text/javascript")
    for bad in (
        "/console/assets/../index.html",
        "/console/assets/%2e%2e/index.html",
        "/console/assets/nope.js",
    ):
        r = server.http.get(bad)
        assert (r.status_code, r.json()["code"]) == (404, "ROUTE_NOT_FOUND")


def test_sign_in_cookie_and_sign_out(server: PlatformServer, tokens: dict[str, str]) -> None:
    client = _browser(server)
    r = client.post("/console/session", json={"token": "nonsense"})
    assert (r.status_code, r.json()["code"]) == (401, "TOKEN_INVALID")
    assert r.headers["content-type"] == "application/json"
    r = client.post("/console/session", content=b"{not json")
    assert (r.status_code, r.json()["code"]) == (400, "REQUEST_INVALID")
    r = client.post("/console/session", json={"token": tokens["console-a"]})
    assert r.status_code == 200
    doc = r.json()
    assert doc["scope"] == "deployment"
    assert doc["deployment"] == "console-a"
    assert doc["csrf"]
    cookie = r.headers["set-cookie"]
    assert cookie.startswith("podbay_session=")
    for flag in ("HttpOnly", "SameSite=Strict", "Path=/"):
        assert flag in cookie
    assert client.get("/console/session").json() == doc
    # Signing out needs the CSRF token; then the session is gone.
    r = client.delete("/console/session")
    assert (r.status_code, r.json()["code"]) == (403, "CSRF_INVALID")
    r = client.delete("/console/session", headers={"X-CSRF-Token": doc["csrf"]})
    assert r.status_code == 204
    r = client.get("/console/session")
    assert (r.status_code, r.json()["code"]) == (401, "SESSION_INVALID")
    # Hostile cookies: garbage, an identity token passed off as a session, bad syntax.
    for value in ("garbage", tokens["console-a"], '"unterminated; x="', "a" * 5000):
        r = server.http.get("/console/session", headers={"Cookie": f"podbay_session={value}"})
        assert (r.status_code, r.json()["code"]) == (401, "SESSION_INVALID"), value
        r = server.http.get("/api/v1/sandboxes", headers={"Cookie": f"podbay_session={value}"})
        assert (r.status_code, r.json()["code"]) == (401, "SESSION_INVALID"), value
    for tail in ("x", "/x/v1/info", "a/b/v1/tunnel"):
        path = "/console/sandboxes/" + tail
        r = client.get(path)
        assert r.status_code in (401, 404), (path, r.text)
        assert r.json()["code"] in ("SESSION_INVALID", "ROUTE_NOT_FOUND")


def test_csrf_and_cross_site_refused(server: PlatformServer, tokens: dict[str, str]) -> None:
    client, doc = _sign_in(server, tokens["console-a"])
    # Another application's malformed cookie on this host does not hide ours.
    mixed = {"Cookie": f'other="x; podbay_session={client.cookies["podbay_session"]}'}
    assert server.http.get("/console/session", headers=mixed).json()["csrf"] == doc["csrf"]
    r = client.put("/api/v1/sandboxes/csrf-probe")
    assert (r.status_code, r.json()["code"]) == (403, "CSRF_INVALID")
    r = client.put("/api/v1/sandboxes/csrf-probe", headers={"X-CSRF-Token": "wrong"})
    assert (r.status_code, r.json()["code"]) == (403, "CSRF_INVALID")
    # Another site's page, even with the token somehow known, is refused; GETs too.
    evil = {"Origin": "http://evil.example", "X-CSRF-Token": doc["csrf"]}
    r = client.put("/api/v1/sandboxes/csrf-probe", headers=evil)
    assert (r.status_code, r.json()["code"]) == (403, "CSRF_INVALID")
    r = client.get("/api/v1/sandboxes", headers={"Sec-Fetch-Site": "cross-site"})
    assert (r.status_code, r.json()["code"]) == (403, "CSRF_INVALID")
    r = _browser(server).post("/console/session", json={"token": tokens["console-a"]}, headers=evil)
    assert (r.status_code, r.json()["code"]) == (403, "CSRF_INVALID")
    # Nothing was created by the refused calls.
    assert client.get("/api/v1/sandboxes").json() == {"sandboxes": []}


def test_a_deployment_session_sees_its_own_only(
    server: PlatformServer, tokens: dict[str, str]
) -> None:
    _attach(server, tokens["console-b"], "b-secret")
    client, doc = _sign_in(server, tokens["console-a"])
    csrf = {"X-CSRF-Token": doc["csrf"]}
    assert client.get("/api/v1/sandboxes").json() == {"sandboxes": []}
    r = client.get("/api/v1/sandboxes/b-secret")
    assert (r.status_code, r.json()["code"]) == (404, "SANDBOX_NOT_FOUND")
    r = client.get("/api/v1/sandboxes", headers={"X-Podbay-Deployment": "console-b"})
    assert (r.status_code, r.json()["code"]) == (403, "DEPLOYMENT_FORBIDDEN")
    r = client.get("/console/sandboxes/console-b/b-secret/v1/files/list?path=/")
    assert (r.status_code, r.json()["code"]) == (404, "SANDBOX_NOT_FOUND")
    r = client.post(
        "/console/sandboxes/console-b/b-secret/v1/exec", json={"command": ["true"]}, headers=csrf
    )
    assert (r.status_code, r.json()["code"]) == (404, "SANDBOX_NOT_FOUND")
    r = client.get("/api/v1/deployments")
    assert (r.status_code, r.json()["code"]) == (403, "OPERATOR_REQUIRED")
    r = client.get("/console/stream?deployment=console-b")
    assert (r.status_code, r.json()["code"]) == (403, "DEPLOYMENT_FORBIDDEN")
    # The token API is untouched: a bearer call ignores the cookie.
    r = client.get("/api/v1/sandboxes", headers={"Authorization": f"Bearer {tokens['console-b']}"})
    assert [s["name"] for s in r.json()["sandboxes"]] == ["b-secret"]
    server.api("DELETE", "/api/v1/sandboxes/b-secret", tokens["console-b"])


def test_operator_api(server: PlatformServer, operator: str, tokens: dict[str, str]) -> None:
    bearer = {"Authorization": f"Bearer {operator}"}
    r = server.http.get("/api/v1/deployments")
    assert (r.status_code, r.json()["code"]) == (401, "TOKEN_INVALID")
    r = server.http.get(
        "/api/v1/deployments", headers={"Authorization": f"Bearer {tokens['console-a']}"}
    )
    assert (r.status_code, r.json()["code"]) == (403, "OPERATOR_REQUIRED")
    r = server.http.post("/api/v1/deployments", json={"name": "made-by-api"}, headers=bearer)
    assert r.status_code == 201
    assert r.headers["content-type"] == "application/json"
    made = r.json()
    r = server.http.post("/api/v1/deployments", json={"name": "made-by-api"}, headers=bearer)
    assert (r.status_code, r.json()["code"]) == (409, "DEPLOYMENT_EXISTS")
    r = server.http.post("/api/v1/deployments", json={"name": "bad name!"}, headers=bearer)
    assert (r.status_code, r.json()["code"]) == (400, "REQUEST_INVALID")
    names = [
        d["name"]
        for d in server.http.get("/api/v1/deployments", headers=bearer).json()["deployments"]
    ]
    assert {"console-a", "console-b", "made-by-api"} <= set(names)
    # The new deployment's token works on the sandbox API as any SDK's would.
    assert server.api("GET", "/api/v1/sandboxes", made["token"]).status_code == 200
    r = server.http.post("/api/v1/deployments/made-by-api/token", json={}, headers=bearer)
    assert r.json()["kind"] == "identity"
    assert server.api("GET", "/api/v1/sandboxes", r.json()["token"]).status_code == 200
    r = server.http.post(
        "/api/v1/deployments/made-by-api/token", json={"kind": "e2b"}, headers=bearer
    )
    assert r.json()["token"].startswith("e2b_")
    r = server.http.post("/api/v1/deployments/nope/token", json={}, headers=bearer)
    assert (r.status_code, r.json()["code"]) == (404, "DEPLOYMENT_NOT_FOUND")
    listed = server.http.get("/api/v1/nodes", headers=bearer).json()
    assert [(n["name"], n["state"]) for n in listed["nodes"]] == [("local", "ready")]
    assert listed["cluster"] is False  # the page offers no Drain
    r = server.http.post("/api/v1/nodes/local/drain", headers=bearer)
    assert (r.status_code, r.json()["code"]) == (409, "NOT_A_CLUSTER")
    handle = _attach(server, made["token"], "doomed")
    assert server.exec(handle, "true").status_code == 200
    assert server.http.delete("/api/v1/deployments/made-by-api", headers=bearer).status_code == 204
    # Its sandboxes are refused at once, as after podbay deployment delete.
    r = server.exec(handle, "true")
    assert (r.status_code, r.json()["code"]) == (401, "SANDBOX_NOT_RUNNING")
    r = server.http.delete("/api/v1/deployments/made-by-api", headers=bearer)
    assert (r.status_code, r.json()["code"]) == (404, "DEPLOYMENT_NOT_FOUND")
    assert server.api("GET", "/api/v1/sandboxes", made["token"]).status_code == 401
    # An operator session does the same with its cookie and CSRF token.
    client, doc = _sign_in(server, operator)
    assert doc["scope"] == "operator"
    assert doc["deployment"] is None
    r = client.post("/api/v1/deployments", json={"name": "made-by-console"})
    assert (r.status_code, r.json()["code"]) == (403, "CSRF_INVALID")
    r = client.post(
        "/api/v1/deployments",
        json={"name": "made-by-console"},
        headers={"X-CSRF-Token": doc["csrf"]},
    )
    assert r.status_code == 201
    r = client.get("/api/v1/sandboxes")
    assert (r.status_code, r.json()["code"]) == (400, "DEPLOYMENT_REQUIRED")
    r = client.get("/api/v1/sandboxes", headers={"X-Podbay-Deployment": "made-by-console"})
    assert r.json() == {"sandboxes": []}
    # An operator token is no identity token: the sandbox API refuses it.
    r = server.api("GET", "/api/v1/sandboxes", operator)
    assert (r.status_code, r.json()["code"]) == (401, "IDENTITY_TOKEN_INVALID")
    # Revoking every operator token ends the operator's sessions and tokens,
    # an open stream too (its last event says why).
    opened, ended = threading.Event(), threading.Event()
    last: list[str] = []

    def watch() -> None:
        with client.stream("GET", "/console/stream?deployment=made-by-console") as r:
            for line in r.iter_lines():
                opened.set()
                last.append(line)
        ended.set()

    threading.Thread(target=watch, daemon=True).start()
    assert opened.wait(60)
    server.cli("admin", "token", "--revoke-all")
    assert ended.wait(60)
    errors = [line for line in last if line.startswith("data: ") and "SESSION_INVALID" in line]
    assert "event: error" in last, last
    assert errors, last
    for answer in (
        client.get("/console/session"),
        server.http.get("/api/v1/deployments", headers=bearer),
    ):
        assert answer.status_code == 401, answer.text


def test_data_plane_through_the_console(server: PlatformServer, tokens: dict[str, str]) -> None:
    token = tokens["console-a"]
    _attach(server, token, "dp")
    client, doc = _sign_in(server, token)
    base = "/console/sandboxes/console-a/dp"
    csrf = {"X-CSRF-Token": doc["csrf"]}
    payload = b"<script>alert(1)</script>" + bytes(range(256)) * 100
    r = client.put(f"{base}/v1/files?path=/workspace/x.html", content=payload)
    assert (r.status_code, r.json()["code"]) == (403, "CSRF_INVALID")
    digest = {"X-Podbay-Sha256": hashlib.sha256(payload).hexdigest()}
    r = client.put(
        f"{base}/v1/files?path=/workspace/x.html", content=payload, headers={**csrf, **digest}
    )
    assert r.status_code in (200, 201, 204), r.text
    r = client.get(f"{base}/v1/files?path=/workspace/x.html")
    assert r.status_code == 200
    assert hashlib.sha256(r.content).digest() == hashlib.sha256(payload).digest()
    assert r.headers["content-disposition"] == "attachment"
    assert r.headers["x-content-type-options"] == "nosniff"
    assert "sandbox" in r.headers["content-security-policy"]
    listing = client.get(f"{base}/v1/files/list?path=/workspace")
    assert listing.headers["content-type"].startswith("application/json")
    assert "x.html" in listing.text
    r = client.post(f"{base}/v1/exec", json={"command": ["echo", "hi"]}, headers=csrf)
    assert r.json()["stdout"] == "hi\n"
    r = client.post(f"{base}/v1/processes", json={"command": ["sleep", "300"]}, headers=csrf)
    assert r.status_code in (200, 201), r.text
    pid = r.json()["process_id"]
    assert pid in client.get(f"{base}/v1/processes").text
    r = client.post(f"{base}/v1/processes/{pid}/signal", json={"signal": "KILL"}, headers=csrf)
    assert r.status_code in (200, 204), r.text
    # A port's relay would serve the sandbox's pages in the console's origin;
    # dot segments (sent raw: httpx would resolve them) do not lead there either.
    r = client.get(f"{base}/v1/ports/8080/")
    assert (r.status_code, r.json()["code"]) == (404, "ROUTE_NOT_FOUND")
    for sneaky in (
        "/v1/files/../ports/8080/",
        "/v1/files/%2e%2e/ports/8080/",
        "/v1/files%2f..%2fports/1/",
    ):
        status, body = _raw_get(server, base + sneaky, client.cookies["podbay_session"])
        assert (status, json.loads(body)["code"]) == (404, "ROUTE_NOT_FOUND"), sneaky
    r = client.get("/console/sandboxes/console-a/no-such/v1/info")
    assert (r.status_code, r.json()["code"]) == (404, "SANDBOX_NOT_FOUND")
    # The terminal: the cookie authenticates, the Origin must be this one.
    ws_url = terminal_url(server.base_url, base)
    session = client.cookies["podbay_session"]
    for origin in ("http://evil.example", None):
        status, body = terminal_refused(ws_url, session, origin)
        assert status == 403
        assert b"CSRF_INVALID" in body
    run_in_terminal(ws_url, session, server.base_url)
    server.api("DELETE", "/api/v1/sandboxes/dp", token)


def test_stream_shows_a_sandbox_appearing(server: PlatformServer, tokens: dict[str, str]) -> None:
    client, _ = _sign_in(server, tokens["console-a"])
    events: list[tuple[str, Any]] = []
    first, appeared = threading.Event(), threading.Event()

    def read() -> None:
        with client.stream("GET", "/console/stream") as r:
            assert r.headers["content-type"].startswith("text/event-stream")
            name = None
            for line in r.iter_lines():
                if line.startswith("event: "):
                    name = line[7:]
                elif line.startswith("data: "):
                    doc = json.loads(line[6:])
                    events.append((name or "", doc))
                    first.set()
                    if name == "sandboxes" and any(
                        s["name"] == "streamed" for s in doc["sandboxes"]
                    ):
                        appeared.set()
                        return

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    assert first.wait(60)  # the first list comes at once
    assert events[0][0] == "sandboxes"
    assert all(s["name"] != "streamed" for s in events[0][1]["sandboxes"])
    _attach(server, tokens["console-a"], "streamed")
    assert appeared.wait(60)
    shown = next(s for s in events[-1][1]["sandboxes"] if s["name"] == "streamed")
    assert shown["state"] == "running"
    assert shown["node"] == "local"
    # Made through podbay's API: from the deployment's own declared environment.
    assert shown["template"] == "console-a"
    reader.join(10)
    server.api("DELETE", "/api/v1/sandboxes/streamed", tokens["console-a"])


def test_stream_names_the_e2b_template_a_sandbox_was_made_from(
    server: PlatformServer, tokens: dict[str, str]
) -> None:
    key = server.cli("deployment", "e2b-key", "console-a").stdout.strip().splitlines()[-1]
    assert key.startswith("e2b_")
    made = server.http.post(
        "/v2/sandboxes", headers={"X-API-Key": key}, json={"templateID": "base", "timeout": 300}
    )
    assert made.status_code == 201, made.text
    e2b_id = made.json()["sandboxID"]
    client, _ = _sign_in(server, tokens["console-a"])
    with client.stream("GET", "/console/stream") as r:
        name = None
        for line in r.iter_lines():
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: ") and name == "sandboxes":
                records = {s["name"]: s for s in json.loads(line[6:])["sandboxes"]}
                break
    assert records[e2b_id]["template"] == "base"
    server.http.delete(f"/sandboxes/{e2b_id}", headers={"X-API-Key": key})


def test_stream_sends_the_newest_metrics_sample_of_each_running_sandbox(
    server: PlatformServer, tokens: dict[str, str]
) -> None:
    _attach(server, tokens["console-a"], "measured-1")
    _attach(server, tokens["console-a"], "measured-2")
    server.api("POST", "/api/v1/sandboxes/measured-2/stop", tokens["console-a"])
    client, _ = _sign_in(server, tokens["console-a"])
    metrics: list[dict[str, Any]] = []
    with client.stream("GET", "/console/stream") as r:
        name = None
        for line in r.iter_lines():
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: ") and name == "metrics":
                metrics.append(json.loads(line[6:])["samples"])
                # Two events carrying the running one: it follows each new sample.
                if len([m for m in metrics if "measured-1" in m]) >= 2:
                    break
    carried = [m["measured-1"] for m in metrics if "measured-1" in m]
    assert carried[0]["at"] < carried[-1]["at"]
    assert set(carried[-1]) >= {"at", "cpu_percent", "memory_bytes", "net_rx_bytes"}
    assert carried[-1]["memory_bytes"] > 0
    # A stopped sandbox is not sampled: it never appears.
    assert all("measured-2" not in m for m in metrics)
    # The same figure the sandbox's own /metrics holds.
    own = server.api("GET", "/api/v1/sandboxes/measured-1/metrics", tokens["console-a"])
    assert carried[-1] in own.json()["samples"]
    for n in ("measured-1", "measured-2"):
        server.api("DELETE", f"/api/v1/sandboxes/{n}", tokens["console-a"])
