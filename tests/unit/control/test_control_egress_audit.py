"""``GET /api/v1/sandboxes/{name}/egress`` through the control plane with a fake
driver (tests/integration/network/test_network_audit_sandbox.py runs it on real
sandboxes of every class)."""

from __future__ import annotations

import pytest
from platform_harness import build_harness, make_settings

from podbay.domain.egress import AUDIT_SIZE, EgressDestination

pytestmark = pytest.mark.anyio
EGRESS = "/api/v1/sandboxes/{}/egress"


@pytest.fixture
async def h(tmp_path):
    async with build_harness(tmp_path, make_settings(tmp_path, idle=600, ttl=6000)) as harness:
        yield harness


async def test_a_running_sandbox_answers_its_machines_audit(h):
    # A destination no resolver named has no "name" (the wire leaves out nulls).
    token = await h.deployment()
    assert (await h.attach(token, "s")).status_code == 200
    (machine,) = h.driver.machines.values()
    h.driver.audits[machine.spec.machine_id] = [
        EgressDestination("203.0.113.5", 443, "tcp", "pypi.org", "reached", 12, 3400, 1.7e9),
        EgressDestination("198.51.100.9", 0, "icmp", None, "refused", 1, 84, 1.7e9 + 2),
    ]
    r = await h.call("GET", EGRESS.format("s"), token)
    assert r.status_code == 200, r.text
    assert r.json() == {
        "destinations": [
            {
                "address": "203.0.113.5",
                "port": 443,
                "protocol": "tcp",
                "name": "pypi.org",
                "verdict": "reached",
                "packets": 12,
                "bytes": 3400,
                "last_seen": "2023-11-14T22:13:20.000Z",
            },
            {
                "address": "198.51.100.9",
                "port": 0,
                "protocol": "icmp",
                "verdict": "refused",
                "packets": 1,
                "bytes": 84,
                "last_seen": "2023-11-14T22:13:22.000Z",
            },
        ],
        "full": False,
    }


async def test_a_suspended_sandbox_answers_its_audit_an_unknown_one_is_404(h):
    token = await h.deployment()
    assert (await h.attach(token, "s")).status_code == 200
    (machine,) = h.driver.machines.values()
    h.driver.audits[machine.spec.machine_id] = [
        EgressDestination("203.0.113.5", 443, "tcp", None, "reached", 1, 60, 1.7e9)
    ]
    assert (await h.call("POST", "/api/v1/sandboxes/s/stop", token)).status_code in (200, 204)
    r = await h.call("GET", EGRESS.format("s"), token)
    assert r.status_code == 200, r.text
    # Suspended, its namespace (and audit) stays; stopped, it has none
    # (tests/integration/network/test_network_audit_sandbox.py).
    assert [d["address"] for d in r.json()["destinations"]] == ["203.0.113.5"]
    r = await h.call("GET", EGRESS.format("nothere"), token)
    assert r.status_code == 404
    assert r.json()["code"] == "SANDBOX_NOT_FOUND"
    r = await h.call("GET", EGRESS.format("Bad_Name!"), token)
    assert r.status_code in (400, 404)
    assert r.json()["code"]


async def test_an_audit_that_holds_its_size_says_it_is_full(h):
    token = await h.deployment()
    assert (await h.attach(token, "s")).status_code == 200
    (machine,) = h.driver.machines.values()
    h.driver.audits[machine.spec.machine_id] = [
        EgressDestination("203.0.113.5", port, "udp", None, "refused", 1, 29, 1.7e9)
        for port in range(AUDIT_SIZE)
    ]
    r = await h.call("GET", EGRESS.format("s"), token)
    assert r.status_code == 200, r.text
    assert r.json()["full"] is True
    assert len(r.json()["destinations"]) == AUDIT_SIZE
