"""The seam to declared environments: 202 while preparing, 409s, nothing half-made."""

from __future__ import annotations

import pytest
from platform_harness import make_settings

from podbay.dataplane.environment_seam import Building, Prepared
from podbay.errors import ApiError
from podbay.serve.platform import create_app
from podbay.store.sqlite import SqliteStore
from podbay.testing.fake_driver import Clock, FakeDriver
from podbay.wire.codes import ErrorCode

pytestmark = pytest.mark.anyio


class ScriptedEnvironment:
    def __init__(self) -> None:
        self.prepares: list = []
        self.applied: list[str] = []
        self.fail_apply = False

    async def prepare(self, deployment, class_):  # type: ignore[no-untyped-def]
        answer = self.prepares.pop(0) if self.prepares else Prepared(key="k", env={"A": "1"})
        if isinstance(answer, Exception):
            raise answer
        return answer

    async def apply(self, deployment, driver, machine_id):  # type: ignore[no-untyped-def]
        if self.fail_apply:
            raise ApiError(ErrorCode.SANDBOX_APPLY_FAILED, "setup[0] `make` exited 2: boom")
        self.applied.append(machine_id)


@pytest.fixture
async def seam(tmp_path):
    import httpx

    settings = make_settings(tmp_path)
    driver = FakeDriver(tmp_path)
    store = SqliteStore.open(settings.data_dir / "podbay.db")
    env = ScriptedEnvironment()
    platform = create_app(settings, store, {"container": driver}, environment=env, clock=Clock())
    async with platform.control.router.lifespan_context(platform.control):
        while not platform.ready:
            import asyncio

            await asyncio.sleep(0.01)
        _, token = await platform.deployments.create("d", "sandbox:\n  toolchain: never\n")
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=platform), base_url="http://podbay.test"
        ) as client:
            yield client, token, env, driver, store
    await driver.close_all()
    await store.close()


async def test_202_then_200(seam):
    client, token, env, driver, _ = seam
    env.prepares = [Building(retry_after_seconds=3), Building(retry_after_seconds=1)]
    auth = {"Authorization": f"Bearer {token}"}
    for want in ("3", "1"):
        r = await client.put("/api/v1/sandboxes/s", headers=auth)
        assert r.status_code == 202
        assert r.headers["retry-after"] == want
        assert r.json() == {"name": "s", "state": "creating"}
        assert driver.machines == {}
    r = await client.put("/api/v1/sandboxes/s", headers=auth)
    assert r.status_code == 200
    assert r.json()["start"] == "created"
    (machine,) = driver.machines.values()
    assert dict(machine.spec.env) == {"A": "1"}
    assert env.applied == [machine.spec.machine_id]
    # reuse, resume and carry-over neither prepare nor apply again
    env.prepares = [RuntimeError("must not be called")]
    await client.post("/api/v1/sandboxes/s/stop", headers=auth)
    assert (await client.put("/api/v1/sandboxes/s", headers=auth)).json()["start"] == "resumed"
    assert len(env.applied) == 1


async def test_prepare_failed(seam):
    client, token, env, driver, store = seam
    env.prepares = [
        ApiError(
            ErrorCode.SANDBOX_PREPARE_FAILED,
            "step apt-get install exited 100: E: Unable to locate package",
        )
    ]
    r = await client.put("/api/v1/sandboxes/s", headers={"Authorization": f"Bearer {token}"})
    assert r.status_code == 409
    assert r.json()["code"] == "SANDBOX_PREPARE_FAILED"
    assert "apt-get" in r.json()["error"]
    assert driver.machines == {}
    assert await store.list_sandboxes() == []


async def test_apply_failed_leaves_nothing(seam):
    client, token, env, driver, store = seam
    env.fail_apply = True
    auth = {"Authorization": f"Bearer {token}"}
    r = await client.put("/api/v1/sandboxes/s", headers=auth)
    assert r.status_code == 409
    assert r.json()["code"] == "SANDBOX_APPLY_FAILED"
    assert "setup[0]" in r.json()["error"]
    assert driver.machines == {}
    assert await store.list_sandboxes() == []
    env.fail_apply = False
    assert (await client.put("/api/v1/sandboxes/s", headers=auth)).status_code == 200
