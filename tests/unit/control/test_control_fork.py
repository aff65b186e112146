"""``POST /api/v1/sandboxes/{name}/fork`` over a fake driver, which cannot copy
a machine: the refusals before any machine is touched (docs/fork.md). The
copies themselves: tests/integration/platform/test_platform_fork.py."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.anyio


async def test_a_class_whose_driver_cannot_copy_is_refused_and_nothing_is_made(harness):
    token = await harness.deployment()
    assert (await harness.attach(token, "src")).status_code == 200
    machines = set(harness.driver.machines)
    r = await harness.call("POST", "/api/v1/sandboxes/src/fork", token, json={"name": "copy"})
    assert r.status_code == 409, r.text
    assert r.json()["code"] == "SANDBOX_FORK_UNSUPPORTED"
    assert set(harness.driver.machines) == machines
    gone = await harness.call("GET", "/api/v1/sandboxes/copy", token)
    assert gone.json()["code"] == "SANDBOX_NOT_FOUND"


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({"names": [f"n{i}" for i in range(17)]}, 400, "SANDBOX_FORK_INVALID"),
        ({"names": []}, 400, "SANDBOX_FORK_INVALID"),
        ({"names": ["a", "a"]}, 400, "SANDBOX_FORK_INVALID"),
        ({}, 400, "SANDBOX_FORK_INVALID"),
        ({"name": "a", "names": ["b"]}, 400, "SANDBOX_FORK_INVALID"),
        ({"name": "-bad"}, 400, "SANDBOX_NAME_INVALID"),
        ({"name": "src"}, 409, "SANDBOX_NAME_TAKEN"),
        ({"name": ["x"]}, 400, "REQUEST_INVALID"),
        ({"other": "x"}, 400, "REQUEST_INVALID"),
    ],
)
async def test_bad_fork_bodies_are_refused_with_a_code(harness, body, status, code):
    token = await harness.deployment()
    assert (await harness.attach(token, "src")).status_code == 200
    r = await harness.call("POST", "/api/v1/sandboxes/src/fork", token, json=body)
    assert (r.status_code, r.json()["code"]) == (status, code), r.text


async def test_an_unknown_source_is_404(harness):
    token = await harness.deployment()
    r = await harness.call("POST", "/api/v1/sandboxes/nobody/fork", token, json={"name": "x"})
    assert (r.status_code, r.json()["code"]) == (404, "SANDBOX_NOT_FOUND")
