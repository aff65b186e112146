"""The operator's default user reaches the agent from the gateway alone: a
client's own X-Podbay-Default-User is dropped."""

from __future__ import annotations

import pytest
from test_gateway_proxy import OK, _agent, _receive, _scope, _Sink

from podbay.dataplane.agentpool import AgentPool
from podbay.gateway.proxy import relay

pytestmark = pytest.mark.anyio


async def test_only_the_gateway_names_the_default_user(tmp_path):  # type: ignore[no-untyped-def]
    seen: list = []
    server = await _agent(tmp_path / "a.sock", [OK, OK], seen)
    pool = AgentPool(tmp_path / "a.sock")
    forged = [(b"x-podbay-default-user", b"root")]
    for extra in ([(b"x-podbay-default-user", b"user")], []):
        status = await relay(
            pool, _scope(headers=forged), _receive([]), _Sink(), b"/v1/exec", "rid", None, extra
        )
        assert status == 200
    with_setting, without = (head.lower() for head, _, _ in seen)
    assert with_setting.count(b"x-podbay-default-user") == 1
    assert b"x-podbay-default-user: user" in with_setting
    assert b"x-podbay-default-user" not in without
    pool.close()
    server.close()
