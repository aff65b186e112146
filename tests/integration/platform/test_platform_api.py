"""Every control-plane row and refusal, against a real server and real sandboxes."""

from __future__ import annotations

import concurrent.futures

import pytest

from podbay.testing.platform import NO_SANDBOX_SPEC

pytestmark = pytest.mark.root


def test_attach_exec_reuse(server, token):
    first = server.attach(token, "e2e-1")
    assert first.status_code == 200, first.text
    h = first.json()
    assert h["start"] == "created"
    assert h["state"] == "running"
    assert (h["class"], h["runtime_class"]) == ("default", "container")
    assert h["endpoint"].startswith(server.base_url + "/sandbox/")
    r = server.exec(h, "sh", "-c", "echo hi; echo err >&2; exit 3")
    assert r.status_code == 200, r.text
    assert r.json()["stdout"] == "hi\n"
    assert r.json()["stderr"] == "err\n"
    assert r.json()["exit_code"] == 3
    again = server.attach(token, "e2e-1").json()
    assert again["start"] == "reused"
    assert again["endpoint"] == h["endpoint"]
    assert server.api("DELETE", "/api/v1/sandboxes/e2e-1", token).status_code == 204


def test_get_list_stop_resume_delete(server, token):
    h = server.attach(token, "e2e-life").json()
    assert server.exec(h, "sh", "-c", "echo kept > /workspace/f").json()["exit_code"] == 0
    record = server.api("GET", "/api/v1/sandboxes/e2e-life", token).json()
    assert record["state"] == "running"
    assert "ceiling_at" in record
    assert "headers" not in record
    assert "endpoint" not in record
    names = [s["name"] for s in server.api("GET", "/api/v1/sandboxes", token).json()["sandboxes"]]
    assert "e2e-life" in names

    assert server.api("POST", "/api/v1/sandboxes/e2e-life/stop", token).status_code == 204
    assert server.api("GET", "/api/v1/sandboxes/e2e-life", token).json()["state"] == "suspended"
    refused = server.exec(h, "true")
    assert refused.status_code == 401
    assert refused.json()["code"] == "SANDBOX_NOT_RUNNING"
    resumed = server.attach(token, "e2e-life").json()
    assert resumed["start"] == "resumed"
    assert server.exec(resumed, "cat", "/workspace/f").json()["stdout"] == "kept\n"

    assert server.api("DELETE", "/api/v1/sandboxes/e2e-life", token).status_code == 204
    gone = server.api("GET", "/api/v1/sandboxes/e2e-life", token)
    assert gone.status_code == 404
    assert gone.json()["code"] == "SANDBOX_NOT_FOUND"
    fresh = server.attach(token, "e2e-life").json()
    assert fresh["start"] == "created"
    assert server.exec(fresh, "ls", "-A", "/workspace").json()["stdout"] == ""
    server.api("DELETE", "/api/v1/sandboxes/e2e-life", token)


def test_refusals(server, token):
    r = server.attach(None, "x")  # type: ignore[arg-type]
    assert (r.status_code, r.json()["code"]) == (401, "IDENTITY_TOKEN_INVALID")
    r = server.attach(token + "x", "x")
    assert (r.status_code, r.json()["code"]) == (401, "IDENTITY_TOKEN_INVALID")
    r = server.attach(token, "-bad")
    assert (r.status_code, r.json()["code"]) == (400, "SANDBOX_NAME_INVALID")
    r = server.attach(token, "x", json={"class": "gpu"})
    assert (r.status_code, r.json()["code"]) == (409, "SANDBOX_CLASS_UNKNOWN")
    r = server.attach(token, "x", json={"class": "default", "size": "xl"})
    assert (r.status_code, r.json()["code"]) == (400, "REQUEST_INVALID")
    no_section = server.create_deployment("no-section", NO_SANDBOX_SPEC)
    r = server.attach(no_section, "x")
    assert (r.status_code, r.json()["code"]) == (409, "SANDBOX_NOT_DECLARED")
    for method, path in (
        ("GET", "/api/v1/sandboxes/nope"),
        ("POST", "/api/v1/sandboxes/nope/stop"),
        ("DELETE", "/api/v1/sandboxes/nope"),
    ):
        r = server.api(method, path, token)
        assert (r.status_code, r.json()["code"]) == (404, "SANDBOX_NOT_FOUND")
    assert set(r.json()) == {"error", "code"}


def test_other_deployment_sees_nothing(server, token):
    other = server.create_deployment("other-agent")
    h = server.attach(other, "private").json()
    mine = server.api("GET", "/api/v1/sandboxes/private", token)
    missing = server.api("GET", "/api/v1/sandboxes/absent", token)
    assert mine.status_code == missing.status_code == 404
    assert mine.json()["error"].replace("private", "N") == missing.json()["error"].replace(
        "absent", "N"
    )
    assert server.api("DELETE", "/api/v1/sandboxes/private", token).status_code == 404
    assert server.exec(h, "true").status_code == 200  # untouched
    server.api("DELETE", "/api/v1/sandboxes/private", other)


def test_caps(server):
    a = server.create_deployment("cap-a", account="acme")
    b = server.create_deployment("cap-b", account="acme")
    for i in range(3):
        assert server.attach(a, f"c{i}").status_code == 200
    over = server.attach(a, "c3")
    assert (over.status_code, over.json()["code"]) == (402, "SANDBOX_LIMIT_REACHED")
    assert server.attach(b, "d0").status_code == 200
    assert server.attach(b, "d1").status_code == 200
    account_over = server.attach(b, "d2")
    assert account_over.status_code == 402
    assert "account" in account_over.json()["error"]
    for t, names in ((a, ["c0", "c1", "c2"]), (b, ["d0", "d1"])):
        for n in names:
            assert server.api("DELETE", f"/api/v1/sandboxes/{n}", t).status_code == 204
    assert server.attach(b, "d2").status_code == 200
    server.api("DELETE", "/api/v1/sandboxes/d2", b)


def test_fifty_concurrent_attaches_one_sandbox(server):
    token = server.create_deployment("racer")
    with concurrent.futures.ThreadPoolExecutor(50) as pool:
        results = list(pool.map(lambda _: server.attach(token, "race"), range(50)))
    assert [r.status_code for r in results] == [200] * 50
    starts = [r.json()["start"] for r in results]
    assert starts.count("created") == 1
    assert starts.count("reused") == 49
    assert len({r.json()["endpoint"] for r in results}) == 1
    listed = server.api("GET", "/api/v1/sandboxes", token).json()["sandboxes"]
    assert [s["name"] for s in listed] == ["race"]
    server.api("DELETE", "/api/v1/sandboxes/race", token)


def test_metrics_and_request_id(server, token):
    h = server.attach(token, "metered").json()
    server.exec(h, "true")
    server.attach(token, "metered", json={"class": "nope"})
    text = server.http.get("/metrics").text
    assert 'podbay_sandboxes{state="running"}' in text
    assert 'podbay_gateway_request_seconds_count{kind="exec"}' in text
    assert 'podbay_attach_seconds_count{start="created"}' in text
    assert 'podbay_refusals_total{code="SANDBOX_CLASS_UNKNOWN"}' in text
    r = server.http.get("/healthz", headers={"X-Request-Id": "rid-1"})
    assert r.headers["x-request-id"] == "rid-1"
    server.api("DELETE", "/api/v1/sandboxes/metered", token)


def test_deployment_cli(server):
    out = server.cli(
        "deployment", "create", "cli-agent", "--spec", "-", input="sandbox:\n  toolchain: never\n"
    )
    token = out.stdout.strip().splitlines()[-1]
    assert token.count(".") == 2
    assert "cli-agent" in server.cli("deployment", "list").stdout
    again = server.cli("deployment", "token", "cli-agent").stdout.strip()
    assert server.api("GET", "/api/v1/sandboxes", again).status_code == 200
    dup = server.cli("deployment", "create", "cli-agent", check=False)
    assert dup.returncode != 0
    assert "exists" in dup.stderr
    server.cli("deployment", "update", "cli-agent", "--spec", "-", input="name: x\n")
    r = server.attach(token, "x")
    assert r.json()["code"] == "SANDBOX_NOT_DECLARED"
    server.cli("deployment", "delete", "cli-agent")
    assert server.api("GET", "/api/v1/sandboxes", token).status_code == 401
    bad = server.cli(
        "deployment", "create", "bad", "--spec", "-", input="sandbox: [1]\n", check=False
    )
    assert bad.returncode != 0


def test_streaming_file_in_constant_memory(server, token):
    import hashlib

    h = server.attach(token, "bigfile").json()
    size = 1024 * 1024 * 1024  # 1 GiB: far more than any buffer could hide
    block = bytes(range(256)) * 4096  # 1 MiB
    digest = hashlib.sha256()
    for _ in range(size // len(block)):
        digest.update(block)

    def body():
        for _ in range(size // len(block)):
            yield block

    def hwm() -> int:
        from pathlib import Path

        for line in Path(f"/proc/{server.pid()}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
        raise AssertionError

    before = hwm()
    r = server.data(
        h,
        "PUT",
        "/v1/files",
        params={"path": "/workspace/big"},
        content=body(),
        headers={"X-Podbay-Sha256": digest.hexdigest()},
    )
    assert r.status_code in (200, 201, 204), r.text
    got = hashlib.sha256()
    with server.http.stream(
        "GET", h["endpoint"] + "/v1/files", params={"path": "/workspace/big"}, headers=h["headers"]
    ) as resp:
        assert resp.status_code == 200
        for chunk in resp.iter_bytes():
            got.update(chunk)
    assert got.hexdigest() == digest.hexdigest()
    assert hwm() - before < 64 * 1024 * 1024  # 1 GiB passed through; memory stayed flat
    server.api("DELETE", "/api/v1/sandboxes/bigfile", token)
