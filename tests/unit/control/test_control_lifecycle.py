"""Idle → suspended, untouched → reclaimed, ceiling → stopped → carried over,
and reconcile after a crash — with a hand-moved clock."""

from __future__ import annotations

import pytest
from platform_harness import build_harness, make_settings

from podbay.domain import SandboxState
from podbay.runtime.base import MachineState
from podbay.testing.fake_driver import FakeDriver

pytestmark = pytest.mark.anyio


@pytest.fixture
async def life(tmp_path):
    settings = make_settings(tmp_path, idle=10, ttl=100, max_age=1000)
    async with build_harness(tmp_path, settings) as h:
        yield h


async def _state(h, token, name):
    r = await h.call("GET", f"/api/v1/sandboxes/{name}", token)
    return r.json()["state"] if r.status_code == 200 else r.status_code


async def test_idle_suspends_then_attach_resumes(life):
    token = await life.deployment()
    await life.attach(token, "s")
    life.clock.advance(5)
    await life.platform.lifecycle.run_pass()
    assert await _state(life, token, "s") == "running"
    life.clock.advance(6)
    await life.platform.lifecycle.run_pass()
    assert await _state(life, token, "s") == "suspended"
    assert next(iter(life.driver.machines.values())).state is MachineState.SUSPENDED
    r = await life.attach(token, "s")
    assert r.json()["start"] == "resumed"


async def test_data_plane_activity_keeps_it_running(life):
    token = await life.deployment()
    h = (await life.attach(token, "s")).json()
    path = h["endpoint"].removeprefix("http://podbay.test") + "/v1/exec"
    for _ in range(3):
        life.clock.advance(8)
        await life.client.post(path, headers=h["headers"], json={})
        await life.platform.lifecycle.run_pass()
    assert await _state(life, token, "s") == "running"


async def test_untouched_suspended_is_reclaimed_and_attach_starts_fresh(life):
    token = await life.deployment()
    first = (await life.attach(token, "s")).json()
    life.clock.advance(11)
    await life.platform.lifecycle.run_pass()
    life.clock.advance(100)
    await life.platform.lifecycle.run_pass()
    assert await _state(life, token, "s") == 404
    assert life.driver.machines == {}
    again = (await life.attach(token, "s")).json()
    assert again["start"] == "created"
    assert again["endpoint"] != first["endpoint"]


async def test_ceiling_stops_and_attach_carries_over(life):
    token = await life.deployment()
    first = (await life.attach(token, "s")).json()
    path = first["endpoint"].removeprefix("http://podbay.test") + "/v1/exec"
    for _ in range(101):  # busy all along: never idle
        life.clock.advance(9.99)
        await life.client.post(path, headers=first["headers"], json={})
    await life.platform.lifecycle.run_pass()
    got = (await life.call("GET", "/api/v1/sandboxes/s", token)).json()
    assert got["state"] == "stopped"
    assert "ceiling_at" not in got
    machine = next(iter(life.driver.machines.values()))
    assert machine.state is MachineState.STOPPED
    r = await life.client.post(path, headers=first["headers"], json={})
    assert r.status_code == 401
    assert r.json()["code"] == "SANDBOX_NOT_RUNNING"
    again = (await life.attach(token, "s")).json()
    assert again["start"] == "carried_over"
    assert again["endpoint"] == first["endpoint"]  # same sandbox, same files
    assert again["ceiling_at"] > first["ceiling_at"]
    assert machine.starts == 2
    # the old incarnation's credential is dead, the new one works
    r = await life.client.post(path, headers=first["headers"], json={})
    assert r.json()["code"] == "SANDBOX_NOT_RUNNING"
    assert (await life.client.post(path, headers=again["headers"], json={})).status_code == 200


async def test_stopped_untouched_is_reclaimed(life):
    token = await life.deployment()
    await life.attach(token, "s")
    life.clock.advance(1001)
    await life.platform.lifecycle.run_pass()
    assert await _state(life, token, "s") == "stopped"
    life.clock.advance(100)
    await life.platform.lifecycle.run_pass()
    assert await _state(life, token, "s") == 404


async def test_deleted_deployment_sandboxes_destroyed_by_pass(life):
    token = await life.deployment("d")
    await life.attach(token, "s")
    await life.platform.deployments.delete("d")
    assert len(life.driver.machines) == 1
    await life.platform.lifecycle.run_pass()
    assert life.driver.machines == {}
    assert await life.store.list_sandboxes() == []


async def test_half_done_pass_is_finished_by_the_next(life):
    token = await life.deployment()
    await life.attach(token, "s")
    row = (await life.store.list_sandboxes())[0]
    # the previous pass suspended the machine, then died before writing the row
    await life.driver.suspend(row.machine_id)
    life.clock.advance(11)
    await life.platform.lifecycle.run_pass()
    assert await _state(life, token, "s") == "suspended"
    # a reclaim that died after marking the row deleting
    await life.store.replace_sandbox(
        (await life.store.list_sandboxes())[0],
        (await life.store.list_sandboxes())[0].moved(SandboxState.DELETING),
    )
    await life.platform.lifecycle.run_pass()
    assert await life.store.list_sandboxes() == []
    assert life.driver.machines == {}


async def test_driver_without_suspend_stops_instead(tmp_path):
    settings = make_settings(tmp_path, idle=10)
    driver = FakeDriver(tmp_path, suspend=False)
    try:
        async with build_harness(tmp_path, settings, driver) as h:
            token = await h.deployment()
            await h.attach(token, "s")
            h.clock.advance(11)
            await h.platform.lifecycle.run_pass()
            assert await _state(h, token, "s") == "stopped"
            assert (await h.attach(token, "s")).json()["start"] == "carried_over"
    finally:
        await driver.close_all()  # a passed-in driver outlives the harness


async def test_restart_reconciles_with_driver(tmp_path):
    settings = make_settings(tmp_path)
    driver = FakeDriver(tmp_path)
    async with build_harness(tmp_path, settings, driver) as h:
        token = await h.deployment()
        handles = {n: (await h.attach(token, n)).json() for n in ("run", "sus", "gone", "half")}
        await h.call("POST", "/api/v1/sandboxes/sus/stop", token)
        rows = {r.name: r for r in await h.store.list_sandboxes()}
        # crash aftermath: one machine vanished, one row stuck creating
        await driver.destroy(rows["gone"].machine_id)
        await h.store.replace_sandbox(rows["half"], rows["half"].moved(SandboxState.DELETING))
        orphan = rows["run"].machine_id.replace("m-", "m-0")
        from podbay.runtime.base import Limits, MachineSpec

        await driver.create(
            MachineSpec(
                machine_id=orphan,
                hostname="x",
                limits=Limits(memory_bytes=1, cpus=1, pids=1, disk_bytes=1),
            )
        )
        h.platform.routes.remove(rows["run"].id)  # a new process knows no routes
    async with build_harness(tmp_path, settings, driver) as h2:
        names = {r.name: r.state for r in await h2.store.list_sandboxes()}
        assert names == {"run": SandboxState.RUNNING, "sus": SandboxState.SUSPENDED}
        assert orphan not in driver.machines
        r = await h2.client.post(
            handles["run"]["endpoint"].removeprefix("http://podbay.test") + "/v1/exec",
            headers=handles["run"]["headers"],
            json={},
        )
        assert r.status_code == 200  # routes restored, old credential still valid
        assert (await h2.attach(token, "run")).json()["start"] == "reused"
        assert (await h2.attach(token, "gone")).json()["start"] == "created"
    await driver.close_all()  # a passed-in driver outlives the harness


async def test_request_in_flight_is_never_idle(life):
    token = await life.deployment()
    h = (await life.attach(token, "s")).json()
    sid = h["endpoint"].rsplit("/", 1)[1]
    life.platform.activity.begin(sid)  # a long exec is running through the gateway
    life.clock.advance(60)
    await life.platform.lifecycle.run_pass()
    assert await _state(life, token, "s") == "running"
    life.platform.activity.end(sid)  # it ends: the idle clock starts now
    life.clock.advance(5)
    await life.platform.lifecycle.run_pass()
    assert await _state(life, token, "s") == "running"
    life.clock.advance(6)
    await life.platform.lifecycle.run_pass()
    assert await _state(life, token, "s") == "suspended"
