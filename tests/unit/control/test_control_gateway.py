"""The gateway inside the platform: credentials checked before any relay."""

from __future__ import annotations

import asyncio
import time

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from podbay.dataplane.credentials import AUDIENCE, mint_credential
from podbay.wire.paths import CREDENTIAL_HEADER

pytestmark = pytest.mark.anyio


async def _handle(harness, name="g"):
    token = await harness.deployment() if not hasattr(harness, "_tok") else harness._tok
    harness._tok = token
    r = await harness.attach(token, name)
    assert r.status_code == 200, r.text
    return r.json()


def _path(handle, tail):
    return handle["endpoint"].removeprefix("http://podbay.test") + tail


async def test_relays_with_credential(harness):
    h = await _handle(harness)
    r = await harness.client.post(
        _path(h, "/v1/exec?x=1"), headers=h["headers"], json={"command": ["true"]}
    )
    assert r.status_code == 200
    echoed = r.json()
    assert echoed["method"] == "POST"
    assert echoed["path"] == "/v1/exec?x=1"
    assert echoed["size"] == len(b'{"command":["true"]}')
    assert CREDENTIAL_HEADER.lower() not in echoed["headers"]
    assert echoed["headers"]["x-request-id"]
    got = await harness.client.get(_path(h, "/v1/processes"), headers=h["headers"])
    assert got.json()["method"] == "GET"


async def test_missing_forged_expired(harness):
    h = await _handle(harness)
    missing = await harness.client.post(_path(h, "/v1/exec"), json={})
    assert missing.status_code == 401
    assert missing.json()["code"] == "CREDENTIAL_INVALID"
    forged_key = Ed25519PrivateKey.generate()
    kid = harness.platform.keys.active().kid
    forged = jwt.encode(
        {
            "aud": AUDIENCE,
            "sub": h["endpoint"].rsplit("/", 1)[1],
            "inc": 1,
            "exp": int(time.time()) + 60,
        },
        forged_key,
        algorithm="EdDSA",
        headers={"kid": kid},
    )
    r = await harness.client.post(_path(h, "/v1/exec"), headers={CREDENTIAL_HEADER: forged})
    assert r.status_code == 401
    assert r.json()["code"] == "CREDENTIAL_INVALID"
    expired, _ = mint_credential(
        harness.platform.keys,
        sandbox_id=h["endpoint"].rsplit("/", 1)[1],
        incarnation=1,
        ttl_seconds=-5,
    )
    r = await harness.client.post(_path(h, "/v1/exec"), headers={CREDENTIAL_HEADER: expired})
    assert r.status_code == 401
    assert r.json()["code"] == "CREDENTIAL_INVALID"
    assert "expired" in r.json()["error"]
    # an identity token is not a credential
    r = await harness.client.post(_path(h, "/v1/exec"), headers={CREDENTIAL_HEADER: harness._tok})
    assert r.status_code == 401


async def test_credential_for_another_sandbox(harness):
    a = await _handle(harness, "a")
    b = await _handle(harness, "b")
    r = await harness.client.post(_path(b, "/v1/exec"), headers=a["headers"], json={})
    assert r.status_code == 403
    assert r.json()["code"] == "CREDENTIAL_WRONG_SANDBOX"


async def test_not_running_then_reattach(harness):
    h = await _handle(harness)
    await harness.call("POST", "/api/v1/sandboxes/g/stop", harness._tok)
    r = await harness.client.post(_path(h, "/v1/exec"), headers=h["headers"], json={})
    assert r.status_code == 401
    assert r.json()["code"] == "SANDBOX_NOT_RUNNING"
    again = (await harness.attach(harness._tok, "g")).json()
    assert again["start"] == "resumed"
    r = await harness.client.post(_path(again, "/v1/exec"), headers=again["headers"], json={})
    assert r.status_code == 200
    # resume keeps the incarnation: the old credential works again too
    r = await harness.client.post(_path(h, "/v1/exec"), headers=h["headers"], json={})
    assert r.status_code == 200


async def test_deleted_sandbox_credential(harness):
    h = await _handle(harness)
    await harness.call("DELETE", "/api/v1/sandboxes/g", harness._tok)
    r = await harness.client.post(_path(h, "/v1/exec"), headers=h["headers"], json={})
    assert r.status_code == 401
    assert r.json()["code"] == "SANDBOX_NOT_RUNNING"


async def test_activity_recorded_in_memory_then_flushed(harness):
    h = await _handle(harness)
    sid = h["endpoint"].rsplit("/", 1)[1]
    harness.clock.advance(30)
    await harness.client.post(_path(h, "/v1/exec"), headers=h["headers"], json={})
    row = (await harness.store.list_sandboxes())[0]
    assert (harness.clock.now - row.last_active_at).total_seconds() == 30  # not written yet
    assert harness.platform.activity.last(sid) == harness.clock.now
    await harness.platform.lifecycle.flush_activity()
    row = (await harness.store.list_sandboxes())[0]
    assert row.last_active_at == harness.clock.now


async def test_streaming_large_body(harness):
    h = await _handle(harness)

    async def chunks():
        for _ in range(64):
            yield b"x" * 65536

    r = await harness.client.put(
        _path(h, "/v1/files?path=/workspace/big"), headers=h["headers"], content=chunks()
    )
    assert r.status_code == 200
    assert r.json()["size"] == 64 * 65536


async def test_bare_paths_route_by_credential(harness):
    """A client resolving "/v1/exec" against the endpoint (URL semantics) loses
    the prefix; the credential alone still names the sandbox."""
    h = await _handle(harness)
    r = await harness.client.post("/v1/exec", headers=h["headers"], json={})
    assert r.status_code == 200
    assert r.json()["path"] == "/v1/exec"
    r = await harness.client.post("/v1/exec", json={})
    assert r.status_code == 401
    assert r.json()["code"] == "CREDENTIAL_INVALID"


async def test_gateway_refusals_counted(harness):
    h = await _handle(harness)
    await harness.client.post(_path(h, "/v1/exec"), json={})
    text = (await harness.client.get("/metrics")).text
    assert 'podbay_refusals_total{code="CREDENTIAL_INVALID"} 1.0' in text


async def test_dead_machine_is_noticed_and_carried_over(harness):
    from podbay.runtime.base import MachineState

    h = await _handle(harness)
    (machine,) = harness.driver.machines.values()
    await harness.driver._close(machine)  # the machine dies under us
    machine.state = MachineState.STOPPED
    r = await harness.client.post(_path(h, "/v1/exec"), headers=h["headers"], json={})
    assert r.status_code == 502
    assert r.json()["code"] == "AGENT_UNREACHABLE"
    for _ in range(100):
        got = await harness.call("GET", "/api/v1/sandboxes/g", harness._tok)
        if got.json()["state"] == "stopped":
            break
        await asyncio.sleep(0.01)
    assert got.json()["state"] == "stopped"
    again = (await harness.attach(harness._tok, "g")).json()
    assert again["start"] == "carried_over"
    r = await harness.client.post(_path(again, "/v1/exec"), headers=again["headers"], json={})
    assert r.status_code == 200


async def test_the_agent_connection_is_open_and_answered_before_the_attach_is(harness):
    """A new sandbox's agent has taken a connection and answered on it by the time
    the attach is answered: the owner's first call finds it warm."""
    h = await _handle(harness, "prewarmed")
    (machine,) = [
        m for m in harness.driver.machines.values() if m.labels.get("podbay.name") == "prewarmed"
    ]
    assert machine.requests == [("CONNECT", ""), ("GET", "/v1/info")]
    r = await harness.client.post(
        _path(h, "/v1/exec"), headers=h["headers"], json={"command": ["true"]}
    )
    assert r.status_code == 200
    assert machine.requests[2:] == [("POST", "/v1/exec")]  # no second connect
