"""While a restarted server takes back its machines, the gateway holds a call
whose sandbox has no route yet instead of refusing its credential; bounded,
then 503 with Retry-After."""

from __future__ import annotations

import asyncio

import pytest
from test_gateway_proxy import OK, _agent, _receive, _Sink

from podbay.control.keys import KeyRing
from podbay.dataplane.activity import ActivityTracker
from podbay.dataplane.credentials import CredentialVerifier, mint_credential
from podbay.dataplane.routes import RouteTable
from podbay.gateway import app as gateway_app
from podbay.gateway.app import Gateway
from podbay.wire.paths import CREDENTIAL_HEADER

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _setup(tmp_path):  # type: ignore[no-untyped-def]
    ring = KeyRing.open(tmp_path / "keys")
    token, _ = mint_credential(ring, sandbox_id="sb-1", incarnation=3, ttl_seconds=60)
    routes = RouteTable()
    gateway = Gateway(CredentialVerifier(ring), routes, ActivityTracker())
    scope = {
        "type": "http",
        "method": "GET",
        "path": "/sandbox/sb-1/v1/info",
        "raw_path": b"/sandbox/sb-1/v1/info",
        "query_string": b"",
        "headers": [(CREDENTIAL_HEADER.lower().encode(), token.encode())],
    }
    return gateway, routes, scope


async def test_a_call_is_held_until_its_sandbox_is_taken_back(tmp_path):  # type: ignore[no-untyped-def]
    gateway, routes, scope = _setup(tmp_path)
    server = await _agent(tmp_path / "a.sock", [OK], [])
    routes.hold()
    sink = _Sink()
    call = asyncio.ensure_future(gateway(scope, _receive([]), sink))
    await asyncio.sleep(0.05)
    assert not call.done()
    assert not sink.messages
    routes.add("sb-1", "m-1", 3, tmp_path / "a.sock")
    routes.settle()
    await call
    assert sink.status == 200
    await routes.close()  # its kept agent connections
    server.close()


async def test_a_sandbox_not_taken_back_is_refused_once_settled(tmp_path):  # type: ignore[no-untyped-def]
    gateway, routes, scope = _setup(tmp_path)
    routes.hold()
    sink = _Sink()
    call = asyncio.ensure_future(gateway(scope, _receive([]), sink))
    await asyncio.sleep(0.05)
    assert not call.done()
    routes.settle()
    await call
    assert sink.status == 401
    assert b"SANDBOX_NOT_RUNNING" in sink.body


async def test_past_the_hold_the_answer_is_503_with_retry_after(tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    monkeypatch.setattr(gateway_app, "ADOPTION_HOLD_SECONDS", 0.01)
    gateway, routes, scope = _setup(tmp_path)
    routes.hold()
    sink = _Sink()
    await gateway(scope, _receive([]), sink)
    assert sink.status == 503
    assert b"SANDBOXES_UNAVAILABLE" in sink.body
    assert sink.headers[b"retry-after"] == b"1"


async def test_a_settled_table_refuses_at_once(tmp_path):  # type: ignore[no-untyped-def]
    gateway, _, scope = _setup(tmp_path)
    sink = _Sink()
    await asyncio.wait_for(gateway(scope, _receive([]), sink), 5)
    assert sink.status == 401
