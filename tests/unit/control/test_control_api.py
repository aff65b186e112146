"""The control-plane API over HTTP (in process), with a fake driver."""

from __future__ import annotations

import asyncio

import pytest

from podbay.errors import ApiError
from podbay.wire.codes import ErrorCode
from podbay.wire.paths import CREDENTIAL_HEADER

pytestmark = pytest.mark.anyio


async def test_attach_creates_then_reuses(harness):
    token = await harness.deployment()
    first = await harness.attach(token, "thread-1")
    assert first.status_code == 200, first.text
    body = first.json()
    assert body["start"] == "created"
    assert body["state"] == "running"
    assert body["class"] == "default"  # the caller's word (none given)
    assert body["runtime_class"] == "container"  # the class actually used
    assert body["endpoint"].startswith("http://podbay.test/sandbox/sb-")
    assert set(body["headers"]) == {CREDENTIAL_HEADER}
    assert "ceiling_at" in body
    assert "expires_at" in body
    again = await harness.attach(token, "thread-1")
    assert again.json()["start"] == "reused"
    assert again.json()["endpoint"] == body["endpoint"]
    assert len(harness.driver.machines) == 1


async def test_attach_body_class_and_unknown_fields(harness):
    token = await harness.deployment()
    ok = await harness.attach(token, "a", json={"class": "default"})
    assert ok.status_code == 200
    bad_class = await harness.attach(token, "b", json={"class": "large"})
    assert bad_class.status_code == 409
    assert bad_class.json()["code"] == "SANDBOX_CLASS_UNKNOWN"
    unknown = await harness.attach(token, "c", json={"class": "default", "gpu": True})
    assert unknown.status_code == 400
    assert unknown.json()["code"] == "REQUEST_INVALID"
    not_json = await harness.attach(token, "c", content=b"{nope")
    assert not_json.json()["code"] == "REQUEST_INVALID"


@pytest.mark.parametrize("name", ["-x", "a/b", "a b", "x" * 129, "ü"])
async def test_invalid_names(harness, name):
    token = await harness.deployment()
    r = await harness.attach(token, name)
    if r.status_code == 404:  # "a/b" never reaches the route: still refused
        assert r.json()["code"] == "ROUTE_NOT_FOUND"
        return
    assert r.status_code == 400
    assert r.json() == {"error": r.json()["error"], "code": "SANDBOX_NAME_INVALID"}


async def test_identity_token_refusals(harness):
    await harness.deployment()
    for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": "Basic x"}):
        r = await harness.client.put("/api/v1/sandboxes/x", headers=headers)
        assert r.status_code == 401
        assert r.json()["code"] == "IDENTITY_TOKEN_INVALID"
    r = await harness.client.get("/api/v1/sandboxes")
    assert r.status_code == 401


async def test_deleted_deployment_token_refused(harness):
    token = await harness.deployment("gone")
    await harness.platform.deployments.delete("gone")
    r = await harness.attach(token, "x")
    assert r.status_code == 401


async def test_not_declared(harness):
    token = await harness.deployment(sandbox=False)
    r = await harness.attach(token, "x")
    assert r.status_code == 409
    assert r.json()["code"] == "SANDBOX_NOT_DECLARED"


async def test_get_list_stop_delete(harness):
    token = await harness.deployment()
    await harness.attach(token, "one")
    await harness.attach(token, "two")
    got = await harness.call("GET", "/api/v1/sandboxes/one", token)
    assert got.status_code == 200
    record = got.json()
    assert set(record) == {
        "name",
        "class",
        "runtime_class",
        "state",
        "created_at",
        "last_active_at",
        "ceiling_at",
    }
    assert "headers" not in record
    listed = await harness.call("GET", "/api/v1/sandboxes", token)
    assert [s["name"] for s in listed.json()["sandboxes"]] == ["one", "two"]

    stop = await harness.call("POST", "/api/v1/sandboxes/one/stop", token)
    assert stop.status_code == 204
    assert (await harness.call("GET", "/api/v1/sandboxes/one", token)).json()[
        "state"
    ] == "suspended"
    resumed = await harness.attach(token, "one")
    assert resumed.json()["start"] == "resumed"

    deleted = await harness.call("DELETE", "/api/v1/sandboxes/one", token)
    assert deleted.status_code == 204
    missing = await harness.call("GET", "/api/v1/sandboxes/one", token)
    assert missing.status_code == 404
    assert missing.json()["code"] == "SANDBOX_NOT_FOUND"
    for method, path in (
        ("DELETE", "/api/v1/sandboxes/one"),
        ("POST", "/api/v1/sandboxes/one/stop"),
    ):
        assert (await harness.call(method, path, token)).status_code == 404
    fresh = await harness.attach(token, "one")
    assert fresh.json()["start"] == "created"


async def test_other_deployment_is_indistinguishable_from_missing(harness):
    mine = await harness.deployment("mine")
    theirs = await harness.deployment("theirs")
    await harness.attach(theirs, "secret")
    for method, path in (
        ("GET", "/api/v1/sandboxes/secret"),
        ("POST", "/api/v1/sandboxes/secret/stop"),
        ("DELETE", "/api/v1/sandboxes/secret"),
    ):
        other = await harness.call(method, path, mine)
        missing = await harness.call(method, path.replace("secret", "nothing-here"), mine)
        assert other.status_code == missing.status_code == 404
        assert other.json()["code"] == missing.json()["code"]
        assert other.json()["error"].replace("secret", "N") == missing.json()["error"].replace(
            "nothing-here", "N"
        )
    assert (await harness.call("GET", "/api/v1/sandboxes", mine)).json() == {"sandboxes": []}
    # Attaching the same name from another deployment makes a separate sandbox.
    mine_attach = await harness.attach(mine, "secret")
    assert mine_attach.json()["start"] == "created"
    assert len(harness.driver.machines) == 2


async def test_fifty_concurrent_attaches_make_one_sandbox(harness):
    token = await harness.deployment()
    harness.driver.start_delay = 0.05
    results = await asyncio.gather(*(harness.attach(token, "race") for _ in range(50)))
    assert all(r.status_code == 200 for r in results)
    starts = sorted(r.json()["start"] for r in results)
    assert starts.count("created") == 1
    assert starts.count("reused") == 49
    assert len({r.json()["endpoint"] for r in results}) == 1
    assert len(harness.driver.machines) == 1


async def test_deployment_cap(harness):
    token = await harness.deployment()
    for i in range(5):
        assert (await harness.attach(token, f"s{i}")).status_code == 200
    over = await harness.attach(token, "s5")
    assert over.status_code == 402
    assert over.json()["code"] == "SANDBOX_LIMIT_REACHED"
    assert len(harness.driver.machines) == 5
    # an existing one still attaches
    assert (await harness.attach(token, "s0")).status_code == 200
    await harness.call("DELETE", "/api/v1/sandboxes/s0", token)
    assert (await harness.attach(token, "s5")).status_code == 200


async def test_account_cap_across_deployments(harness):
    a = await harness.deployment("a", account="acme")
    b = await harness.deployment("b", account="acme")
    other = await harness.deployment("c", account="other")
    for i in range(5):
        assert (await harness.attach(a, f"x{i}")).status_code == 200
    for i in range(3):
        assert (await harness.attach(b, f"y{i}")).status_code == 200
    over = await harness.attach(b, "y3")
    assert over.status_code == 402
    assert "account" in over.json()["error"]
    assert (await harness.attach(other, "z")).status_code == 200


async def test_concurrent_new_names_respect_cap(harness):
    token = await harness.deployment()
    harness.driver.start_delay = 0.02
    results = await asyncio.gather(*(harness.attach(token, f"n{i}") for i in range(12)))
    assert sorted(r.status_code for r in results) == [200] * 5 + [402] * 7
    assert len(harness.driver.machines) == 5


async def test_start_failure_leaves_nothing(harness):
    token = await harness.deployment()
    harness.driver.fail_start = RuntimeError("runc exploded")
    r = await harness.attach(token, "broken")
    assert r.status_code == 502
    assert r.json()["code"] == "SANDBOX_START_FAILED"
    assert harness.driver.machines == {}
    assert await harness.store.list_sandboxes() == []
    assert (await harness.call("GET", "/api/v1/sandboxes/broken", token)).status_code == 404
    harness.driver.fail_start = None
    assert (await harness.attach(token, "broken")).json()["start"] == "created"


async def test_unknown_route_and_method(harness):
    token = await harness.deployment()
    r = await harness.call("GET", "/api/v1/nothing", token)
    assert r.status_code == 404
    assert r.json()["code"] == "ROUTE_NOT_FOUND"
    r = await harness.call("PATCH", "/api/v1/sandboxes/x", token)
    assert r.status_code == 405
    assert r.json()["code"] == "METHOD_NOT_ALLOWED"


async def test_healthz_and_metrics(harness):
    assert (await harness.client.get("/healthz")).status_code == 200
    token = await harness.deployment()
    await harness.attach(token, "m")
    await harness.attach(token, "m", json={"class": "nope"})
    text = (await harness.client.get("/metrics")).text
    assert 'podbay_sandboxes{state="running"} 1.0' in text
    assert 'podbay_refusals_total{code="SANDBOX_CLASS_UNKNOWN"} 1.0' in text
    assert "podbay_attach_seconds_bucket" in text


async def test_request_id_echoed(harness):
    r = await harness.client.get("/healthz", headers={"X-Request-Id": "abc123"})
    assert r.headers["x-request-id"] == "abc123"
    assert (await harness.client.get("/healthz")).headers["x-request-id"]


async def test_a_store_gone_under_a_resume_is_503_with_retry_after(harness, monkeypatch):
    """The shared store going away under an attach (PostgreSQL shutting down:
    STORE_UNAVAILABLE) is a temporary refusal the client waits out, not the
    502 of a sandbox that could not be brought up, nor a 500."""
    token = await harness.deployment()
    assert (await harness.attach(token, "s")).status_code == 200
    assert (await harness.call("POST", "/api/v1/sandboxes/s/stop", token)).status_code == 204
    real = harness.store.replace_sandbox

    async def away(old: object, new: object, event: object = None) -> None:
        raise ApiError(ErrorCode.STORE_UNAVAILABLE, "the database went away", retry_after=2)

    monkeypatch.setattr(harness.store, "replace_sandbox", away)
    r = await harness.attach(token, "s")
    assert r.status_code == 503, r.text
    assert r.json()["code"] == "STORE_UNAVAILABLE"
    assert r.headers["Retry-After"] == "2"
    monkeypatch.setattr(harness.store, "replace_sandbox", real)
    again = await harness.attach(token, "s")
    assert again.status_code == 200
    assert again.json()["start"] == "resumed"
