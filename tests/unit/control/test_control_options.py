"""Attach's options (labels, env, cpus, memory, idle timeout): checked, kept in
the store, shown in records, handed to the driver, used by the lifecycle —
with a fake driver and a hand-moved clock (tests/integration/platform/
test_platform_options.py runs them on real sandboxes)."""

from __future__ import annotations

import pytest
from platform_harness import build_harness, make_settings

from podbay.dataplane.nodeapi import POOL_LABEL
from podbay.runtime.base import MachineState
from podbay.store.sqlite import SqliteStore

pytestmark = pytest.mark.anyio
MIB = 1024 * 1024


@pytest.fixture
async def h(tmp_path):
    settings = make_settings(tmp_path, idle=600, ttl=6000, max_age=60000)
    async with build_harness(tmp_path, settings) as harness:
        yield harness


async def _record(h, token, name):
    return (await h.call("GET", f"/api/v1/sandboxes/{name}", token)).json()


async def test_options_reach_the_machine_and_the_record(h):
    token = await h.deployment()
    body = {
        "labels": {"team": "a", "ticket": "42"},
        "env": {"GREETING": "hello", "lower_ok": "1"},
        "cpus": 0.5,
        "memory_mib": 512,
        "idle_timeout_seconds": 120,
    }
    r = await h.attach(token, "s", json=body)
    assert r.status_code == 200, r.text
    handle = r.json()
    for key, value in body.items():
        assert handle[key] == value
    (machine,) = h.driver.machines.values()
    assert machine.spec.limits.cpus == 0.5
    assert machine.spec.limits.memory_bytes == 512 * MIB
    assert machine.spec.env["GREETING"] == "hello"
    record = await _record(h, token, "s")
    assert {k: record[k] for k in body} == body


async def test_no_options_leave_the_record_as_before(h):
    token = await h.deployment()
    for body in (None, {"class": "default"}):
        r = await h.attach(token, "plain", **({} if body is None else {"json": body}))
        assert r.status_code == 200
        for key in ("labels", "env", "cpus", "memory_mib", "idle_timeout_seconds"):
            assert key not in r.json()
    (machine,) = h.driver.machines.values()
    assert machine.spec.limits.cpus == h.settings.runtime.cpus
    assert machine.spec.limits.memory_bytes == h.settings.runtime.memory_bytes


async def test_options_survive_a_restart_of_the_store(h, tmp_path):
    token = await h.deployment()
    await h.attach(token, "kept", json={"labels": {"k": "v"}, "env": {"A": "1"}, "cpus": 1.5})
    store = SqliteStore.open(h.settings.data_dir / "podbay.db")
    try:
        deployment_id = next(iter(h.driver.machines.values())).labels["podbay.deployment"]
        row = await store.get_sandbox(deployment_id, "kept")
    finally:
        await store.close()
    assert row is not None
    assert dict(row.options.labels) == {"k": "v"}
    assert dict(row.options.env) == {"A": "1"}
    assert row.options.cpus == 1.5


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({"cpus": 0.1}, "SANDBOX_CPUS_BELOW_MIN"),
        ({"cpus": 64}, "SANDBOX_CPUS_ABOVE_MAX"),
        ({"memory_mib": 16}, "SANDBOX_MEMORY_BELOW_MIN"),
        ({"memory_mib": 1 << 20}, "SANDBOX_MEMORY_ABOVE_MAX"),
        ({"idle_timeout_seconds": 1}, "SANDBOX_IDLE_TIMEOUT_BELOW_MIN"),
        ({"idle_timeout_seconds": 10**9}, "SANDBOX_IDLE_TIMEOUT_ABOVE_MAX"),
        ({"env": {"A=B": "x"}}, "SANDBOX_ENV_INVALID"),
        ({"env": {"A": "x\u0000y"}}, "SANDBOX_ENV_INVALID"),
        ({"env": {f"V{i}": "x" for i in range(200)}}, "SANDBOX_ENV_INVALID"),
        ({"env": {"BIG": "x" * 40000}}, "SANDBOX_ENV_INVALID"),
        ({"labels": {"": "x"}}, "SANDBOX_LABELS_INVALID"),
        ({"labels": {"k": "a\nb"}}, "SANDBOX_LABELS_INVALID"),
        ({"labels": {"k": "v" * 300}}, "SANDBOX_LABELS_INVALID"),
        ({"labels": {f"k{i}": "v" for i in range(40)}}, "SANDBOX_LABELS_INVALID"),
        ({"labels": {"k": 1}}, "REQUEST_INVALID"),
        ({"cpus": "two"}, "REQUEST_INVALID"),
    ],
)
async def test_bad_options_are_refused_with_a_code_and_nothing_is_made(h, body, code):
    token = await h.deployment()
    r = await h.attach(token, "bad", json=body)
    assert r.status_code == 400, r.text
    assert r.json()["code"] == code
    assert h.driver.machines == {}
    assert (await h.call("GET", "/api/v1/sandboxes/bad", token)).status_code == 404


async def test_an_existing_sandbox_keeps_its_options(h):
    token = await h.deployment()
    first = {"labels": {"k": "v"}, "cpus": 0.5}
    assert (await h.attach(token, "s", json=first)).status_code == 200
    # Without options, or with the same ones: reused.
    for body in (None, first, {"cpus": 0.5}):
        r = await h.attach(token, "s", **({} if body is None else {"json": body}))
        assert r.status_code == 200, r.text
        assert r.json()["start"] == "reused"
    for body in ({"cpus": 1.0}, {"labels": {"k": "w"}}, {"env": {"A": "1"}}):
        r = await h.attach(token, "s", json=body)
        assert r.status_code == 409, body
        assert r.json()["code"] == "SANDBOX_OPTIONS_CONFLICT"


async def test_list_filters_on_labels(h):
    token = await h.deployment()
    await h.attach(token, "a1", json={"labels": {"team": "a", "tier": "x"}})
    await h.attach(token, "a2", json={"labels": {"team": "a"}})
    await h.attach(token, "b1", json={"labels": {"team": "b"}})
    await h.attach(token, "none")

    async def names(query: str) -> list[str]:
        r = await h.call("GET", f"/api/v1/sandboxes{query}", token)
        assert r.status_code == 200, r.text
        return sorted(s["name"] for s in r.json()["sandboxes"])

    assert await names("") == ["a1", "a2", "b1", "none"]
    assert await names("?label=team=a") == ["a1", "a2"]
    assert await names("?label=team=a&label=tier=x") == ["a1"]
    assert await names("?label=team=c") == []
    r = await h.call("GET", "/api/v1/sandboxes?label=team", token)
    assert (r.status_code, r.json()["code"]) == (400, "SANDBOX_LABELS_INVALID")


async def test_own_idle_timeout_drives_suspension(h):
    token = await h.deployment()
    await h.attach(token, "quick", json={"idle_timeout_seconds": 60})
    await h.attach(token, "default")
    h.clock.advance(61)
    await h.platform.lifecycle.run_pass()
    assert (await _record(h, token, "quick"))["state"] == "suspended"
    assert (await _record(h, token, "default"))["state"] == "running"
    h.clock.advance(540)  # the server's 600 s
    await h.platform.lifecycle.run_pass()
    assert (await _record(h, token, "default"))["state"] == "suspended"
    states = {m.state for m in h.driver.machines.values()}
    assert states == {MachineState.SUSPENDED}


async def test_options_survive_carry_over(tmp_path):
    settings = make_settings(tmp_path, idle=600, ttl=6000, max_age=100)
    async with build_harness(tmp_path, settings) as h:
        token = await h.deployment()
        body = {"labels": {"k": "v"}, "env": {"A": "1"}, "memory_mib": 768}
        await h.attach(token, "s", json=body)
        h.clock.advance(101)
        await h.platform.lifecycle.run_pass()
        assert (await _record(h, token, "s"))["state"] == "stopped"
        r = await h.attach(token, "s")
        assert r.json()["start"] == "carried_over"
        assert {k: r.json()[k] for k in body} == body
        (machine,) = h.driver.machines.values()
        assert machine.spec.limits.memory_bytes == 768 * MIB
        assert machine.spec.env["A"] == "1"


async def test_a_sandbox_with_its_own_machine_options_never_takes_a_pooled_one(tmp_path):
    settings = make_settings(tmp_path)
    settings.runtime.warm_pool = 1
    async with build_harness(tmp_path, settings) as h:
        token = await h.deployment()
        await h.attach(token, "first")  # the pool of this environment fills after it
        pool = h.platform.pools["container"]
        await pool.wait_filled()
        (ready,) = [m for m, machine in h.driver.machines.items() if POOL_LABEL in machine.labels]
        shaped = (await h.attach(token, "shaped", json={"env": {"A": "1"}})).json()
        assert shaped["env"] == {"A": "1"}
        assert POOL_LABEL in h.driver.machines[ready].labels  # still waiting in the pool
        await h.attach(token, "plain")
        assert POOL_LABEL not in h.driver.machines[ready].labels  # taken by "plain"
        await pool.close()


async def test_a_cpus_that_is_no_number_is_refused(h):
    token = await h.deployment()
    for raw in (b'{"cpus": NaN}', b'{"cpus": Infinity}', b'{"cpus": true}'):
        r = await h.attach(token, "nan", content=raw)
        assert (r.status_code, r.json()["code"]) == (400, "REQUEST_INVALID"), raw
    assert h.driver.machines == {}
