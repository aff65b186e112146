"""``POST /api/v1/sandboxes/{name}/fork`` over a fake driver, which cannot copy
a machine: the refusals before any machine is touched (docs/fork.md). The
copies themselves: tests/integration/platform/test_platform_fork.py."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from dataclasses import replace
from pathlib import Path

import pytest
from platform_harness import Harness, build_harness

from podbay.errors import DriverError
from podbay.runtime.base import ForkCopy
from podbay.testing.fake_driver import FakeDriver

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


class ForkingFakeDriver(FakeDriver):
    """The fake driver with a fork: a copy is a new stopped machine of the
    source's spec under its own id, hostname and labels."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.capabilities = replace(self.capabilities, fork=True)

    async def fork(self, source_id: str, copies: Sequence[ForkCopy]) -> float:
        spec = self._get(source_id).spec
        for copy in copies:
            new = replace(
                spec, machine_id=copy.machine_id, hostname=copy.hostname, labels=copy.labels
            )
            await self.create(new)
        return 0.0


@pytest.fixture
async def forking(tmp_path: Path) -> AsyncIterator[Harness]:
    driver = ForkingFakeDriver(tmp_path)
    async with build_harness(tmp_path, driver=driver) as h:
        yield h
    await driver.close_all()


async def test_copies_are_sandboxes_of_their_own(forking):
    token = await forking.deployment()
    assert (await forking.attach(token, "src")).status_code == 200
    r = await forking.call("POST", "/api/v1/sandboxes/src/fork", token, json={"names": ["a", "b"]})
    assert r.status_code == 200, r.text
    made = r.json()["sandboxes"]
    assert [s["name"] for s in made] == ["a", "b"]
    assert all(s["state"] == "running" and s["start"] == "created" for s in made)
    assert len({s["endpoint"] for s in made}) == 2
    assert r.json()["processes"] is False
    labels = {m.labels["podbay.name"] for m in forking.driver.machines.values()}
    assert labels == {"src", "a", "b"}
    events = await forking.call("GET", "/api/v1/sandboxes/src/events", token)
    assert "forked" in [e["kind"] for e in events.json()["events"]]


async def test_a_copy_that_fails_to_start_leaves_nothing_of_any_copy(forking):
    token = await forking.deployment()
    assert (await forking.attach(token, "src")).status_code == 200
    source_machines = set(forking.driver.machines)
    forking.driver.fail_start = DriverError("no room for it")
    r = await forking.call("POST", "/api/v1/sandboxes/src/fork", token, json={"names": ["a", "b"]})
    assert (r.status_code, r.json()["code"]) == (502, "SANDBOX_START_FAILED")
    assert set(forking.driver.machines) == source_machines
    for name in ("a", "b"):
        gone = await forking.call("GET", f"/api/v1/sandboxes/{name}", token)
        assert gone.json()["code"] == "SANDBOX_NOT_FOUND"
    forking.driver.fail_start = None
    again = await forking.call("POST", "/api/v1/sandboxes/src/fork", token, json={"name": "a"})
    assert again.status_code == 200, again.text


async def test_a_fork_past_the_deployments_cap_leaves_nothing(forking):
    token = await forking.deployment()  # the harness caps a deployment at 5
    assert (await forking.attach(token, "src")).status_code == 200
    names = [f"n{i}" for i in range(5)]
    r = await forking.call("POST", "/api/v1/sandboxes/src/fork", token, json={"names": names})
    assert (r.status_code, r.json()["code"]) == (402, "SANDBOX_LIMIT_REACHED")
    listed = await forking.call("GET", "/api/v1/sandboxes", token)
    assert [s["name"] for s in listed.json()["sandboxes"]] == ["src"]
