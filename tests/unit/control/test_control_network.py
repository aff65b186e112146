"""A sandbox's egress policy through the control plane: attach's ``network``,
the sandbox section's default, ``GET``/``PUT .../network``, refusals with
codes — with a fake driver (tests/integration/network/test_network_egress_api.py
runs it on real sandboxes)."""

from __future__ import annotations

import pytest
from platform_harness import build_harness, make_settings

from podbay.domain.egress import OPEN, EgressPolicy

pytestmark = pytest.mark.anyio
NET = "/api/v1/sandboxes/{}/network"


@pytest.fixture
async def h(tmp_path):
    async with build_harness(tmp_path, make_settings(tmp_path, idle=600, ttl=6000)) as harness:
        yield harness


async def _deployment(h, network: str) -> str:
    spec = f"name: x\nsandbox:\n  toolchain: never\n  network: {network}\n"
    _, token = await h.platform.deployments.create("netdep", spec, "default")
    return token


async def test_attach_sets_the_policy_and_get_shows_it(h):
    token = await h.deployment()
    asked = {"allow": ["203.0.113.0/24", "PyPI.org"], "deny": ["203.0.113.9"]}
    r = await h.attach(token, "s", json={"network": asked})
    assert r.status_code == 200, r.text
    (machine,) = h.driver.machines.values()
    assert machine.spec.egress == EgressPolicy.parse(asked)
    got = (await h.call("GET", NET.format("s"), token)).json()
    assert got == {
        "internet": True,
        "allow": ["203.0.113.0/24", "pypi.org"],
        "deny": ["203.0.113.9/32"],
    }


async def test_without_one_the_sandbox_section_default_applies_then_open(h):
    token = await _deployment(h, "{internet: false}")
    assert (await h.attach(token, "closed")).status_code == 200
    (machine,) = h.driver.machines.values()
    assert machine.spec.egress == EgressPolicy(internet=False)
    assert (await h.call("GET", NET.format("closed"), token)).json()["internet"] is False
    plain = await h.deployment("plain")
    assert (await h.attach(plain, "open")).status_code == 200
    got = (await h.call("GET", NET.format("open"), plain)).json()
    assert got == {"internet": True}  # open
    opened = [m for m in h.driver.machines.values() if m.spec.machine_id != machine.spec.machine_id]
    assert opened[0].spec.egress == OPEN


async def test_a_section_network_that_is_not_a_policy_refuses_attach(h):
    # Registered unchecked (before policies existed, or edited by hand);
    # a registration checks it (tests/unit/environment/test_spec.py).
    token = await _deployment(h, "{allow: [not-a-name]}")
    r = await h.attach(token, "s")
    assert r.json()["code"] == "SANDBOX_PREPARE_FAILED"
    assert "not-a-name" in r.json()["error"]
    assert not h.driver.machines


async def test_put_changes_the_running_machine_and_the_record(h):
    token = await h.deployment()
    assert (await h.attach(token, "s")).status_code == 200
    r = await h.call("PUT", NET.format("s"), token, json={"internet": False})
    assert r.status_code == 200, r.text
    assert r.json()["internet"] is False
    (machine,) = h.driver.machines.values()
    assert ("set_egress", machine.spec.machine_id) in h.driver.calls
    assert machine.spec.egress == EgressPolicy(internet=False)
    row = await h.store.get_sandbox((await h.platform.deployments.get("agent")).id, "s")
    assert row is not None
    assert row.options.network == EgressPolicy(internet=False)
    # Re-attach without a policy keeps the sandbox; naming another one is a conflict.
    assert (await h.attach(token, "s")).status_code == 200
    r = await h.attach(token, "s", json={"network": {"deny": ["192.0.2.1"]}})
    assert r.status_code == 409
    assert r.json()["code"] == "SANDBOX_OPTIONS_CONFLICT"
    assert (await h.attach(token, "s", json={"network": {"internet": False}})).status_code == 200


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({"allow": ["evil.org;rm"]}, "SANDBOX_NETWORK_ENTRY_INVALID"),
        ({"deny": ["10.0.0.1/8"]}, "SANDBOX_NETWORK_ENTRY_INVALID"),
        ({"internet": False, "allow": ["pypi.org"]}, "SANDBOX_NETWORK_INVALID"),
        ({"allow": [f"198.51.100.{i}" for i in range(256)] * 2}, "SANDBOX_NETWORK_TOO_LARGE"),
        ({"allowed": []}, "REQUEST_INVALID"),
        ({"allow": "pypi.org"}, "REQUEST_INVALID"),
        ({"internet": "no"}, "REQUEST_INVALID"),
    ],
)
async def test_a_bad_policy_is_refused_with_its_code(h, body, code):
    token = await h.deployment()
    assert (await h.attach(token, "s")).status_code == 200
    for r in (
        await h.call("PUT", NET.format("s"), token, json=body),
        await h.attach(token, "other", json={"network": body}),
    ):
        assert r.status_code == 400, r.text
        assert r.json()["code"] == code
    assert "other" not in {m.spec.hostname for m in h.driver.machines.values()}
    assert len(h.driver.machines) == 1


async def test_unknown_sandboxes_and_tokens_are_refused(h):
    token = await h.deployment()
    r = await h.call("GET", NET.format("nope"), token)
    assert r.status_code == 404
    assert r.json()["code"] == "SANDBOX_NOT_FOUND"
    r = await h.call("PUT", NET.format("nope"), token, json={})
    assert r.status_code == 404
    r = await h.call("GET", NET.format("nope"), "forged")
    assert r.status_code == 401
    r = await h.call("PUT", NET.format("Bad Name"), token, json={})
    assert r.status_code == 400
    assert r.json()["code"] == "SANDBOX_NAME_INVALID"
