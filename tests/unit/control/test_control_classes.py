"""Sandbox classes through the control-plane API, over one fake driver per class."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from platform_harness import Harness, build_harness, make_settings

from podbay.dataplane.classes import CHECKING_RETRY_SECONDS
from podbay.runtime.base import Driver
from podbay.runtime.classes import HostCheck
from podbay.testing.fake_driver import FakeDriver

pytestmark = pytest.mark.anyio


def two_classes(tmp_path: Path) -> dict[str, FakeDriver]:
    roots = {name: tmp_path / name for name in ("gvisor", "container")}
    for root in roots.values():
        root.mkdir()
    return {name: FakeDriver(root) for name, root in roots.items()}


def checks(results: dict[str, HostCheck]) -> Callable[[str, Driver], object]:
    async def check(name: str, driver: Driver) -> HostCheck:
        await driver.prepare()
        return results.get(name, HostCheck(True, True, f"{name} runs"))

    return check


async def run(
    tmp_path: Path,
    drivers: dict[str, FakeDriver],
    *,
    classes: str,
    pin: str = "",
    results: dict[str, HostCheck] | None = None,
    prove: Callable[[str, Driver], object] | None = None,
) -> AsyncIterator[Harness]:
    settings = make_settings(tmp_path)
    settings.runtime.classes = classes
    settings.runtime.default_class = pin
    async with build_harness(
        tmp_path,
        settings,
        drivers=drivers,  # type: ignore[arg-type]
        check=checks(results or {}),
        prove=prove,
    ) as h:
        yield h


@pytest.fixture
async def both(tmp_path: Path) -> AsyncIterator[tuple[Harness, dict[str, FakeDriver]]]:
    drivers = two_classes(tmp_path)
    async for h in run(tmp_path, drivers, classes="gvisor,container"):
        yield h, drivers
    for d in drivers.values():
        await d.close_all()


async def test_default_is_the_first_enabled_class_that_runs_and_the_record_says_so(both):
    h, drivers = both
    token = await h.deployment()
    handle = (await h.attach(token, "a")).json()
    assert handle["runtime_class"] == "gvisor"
    assert list(drivers["gvisor"].machines)
    assert not drivers["container"].machines
    record = (await h.call("GET", "/api/v1/sandboxes/a", token)).json()
    assert record["runtime_class"] == "gvisor"
    listed = (await h.call("GET", "/api/v1/sandboxes", token)).json()["sandboxes"]
    assert [s["runtime_class"] for s in listed] == ["gvisor"]
    health = (await h.client.get("/healthz")).json()
    assert health["classes"] == {
        "default": "gvisor",
        "available": ["gvisor", "container"],
        "enabled": ["gvisor", "container"],
        "checking": [],
    }


async def test_a_named_class_runs_on_its_own_driver_and_the_gateway_reaches_it(both):
    h, drivers = both
    token = await h.deployment()
    r = await h.attach(token, "c", json={"class": "container"})
    assert r.status_code == 200, r.text
    handle = r.json()
    assert handle["runtime_class"] == "container"
    assert handle["start"] == "created"
    assert list(drivers["container"].machines)
    assert not drivers["gvisor"].machines
    echoed = await h.client.get(handle["endpoint"] + "/v1/info", headers=handle["headers"])
    assert echoed.status_code == 200
    assert echoed.json()["path"] == "/v1/info"


async def test_a_known_class_this_server_does_not_run_is_409_naming_what_it_runs(both):
    h, drivers = both
    token = await h.deployment()
    r = await h.attach(token, "v", json={"class": "vm"})
    assert r.status_code == 409
    body = r.json()
    assert body["code"] == "SANDBOX_CLASS_UNAVAILABLE"
    assert "'vm'" in body["error"]
    assert "not enabled" in body["error"]
    assert body["error"].endswith("it can run: gvisor, container")
    assert not drivers["gvisor"].machines
    assert not drivers["container"].machines
    missing = await h.call("GET", "/api/v1/sandboxes/v", token)
    assert missing.status_code == 404  # nothing half-made


async def test_an_unknown_class_stays_unknown(both):
    h, _ = both
    token = await h.deployment()
    r = await h.attach(token, "x", json={"class": "gpu"})
    assert r.status_code == 409
    assert r.json()["code"] == "SANDBOX_CLASS_UNKNOWN"
    assert "default, vm, gvisor, container" in r.json()["error"]


async def test_an_existing_sandbox_keeps_its_class(both):
    h, drivers = both
    token = await h.deployment()
    assert (await h.attach(token, "s")).json()["runtime_class"] == "gvisor"
    for asked in ("default", "gvisor"):
        again = await h.attach(token, "s", json={"class": asked})
        assert again.status_code == 200
        assert again.json()["start"] == "reused"
        assert again.json()["runtime_class"] == "gvisor"
    other = await h.attach(token, "s", json={"class": "container"})
    assert other.status_code == 409
    assert other.json()["code"] == "SANDBOX_CLASS_CONFLICT"
    assert "'gvisor'" in other.json()["error"]
    assert not drivers["container"].machines
    # Deleting it frees the name for another class.
    assert (await h.call("DELETE", "/api/v1/sandboxes/s", token)).status_code == 204
    moved = await h.attach(token, "s", json={"class": "container"})
    assert moved.status_code == 200
    assert moved.json()["runtime_class"] == "container"


async def test_suspend_resume_and_carry_over_stay_in_the_class(both):
    h, drivers = both
    token = await h.deployment()
    await h.attach(token, "life", json={"class": "container"})
    assert (await h.call("POST", "/api/v1/sandboxes/life/stop", token)).status_code == 204
    calls = [c for c, _ in drivers["container"].calls]
    assert "suspend" in calls
    assert not drivers["gvisor"].calls
    back = await h.attach(token, "life")
    assert back.json()["start"] == "resumed"
    assert back.json()["runtime_class"] == "container"
    assert [c for c, _ in drivers["container"].calls][-1] == "resume"


async def test_a_class_that_fails_its_check_is_unavailable_with_the_reason(tmp_path):
    drivers = two_classes(tmp_path)
    broken = {"gvisor": HostCheck(False, False, "runsc not found: apt-get install runsc")}
    async for h in run(tmp_path, drivers, classes="gvisor,container", results=broken):
        token = await h.deployment()
        assert (await h.attach(token, "a")).json()["runtime_class"] == "container"
        r = await h.attach(token, "b", json={"class": "gvisor"})
        assert r.status_code == 409
        assert r.json()["code"] == "SANDBOX_CLASS_UNAVAILABLE"
        assert "runsc not found" in r.json()["error"]
        assert r.json()["error"].endswith("it can run: container")
    for d in drivers.values():
        await d.close_all()


async def test_a_slow_class_is_never_what_default_means_but_runs_when_named(tmp_path):
    drivers = {"vm": FakeDriver(tmp_path / "vm"), **two_classes(tmp_path)}
    (tmp_path / "vm").mkdir()
    tcg = {"vm": HostCheck(True, False, "TCG only: KVM guests do not boot")}
    async for h in run(tmp_path, drivers, classes="vm,gvisor,container", results=tcg):
        token = await h.deployment()
        assert (await h.attach(token, "d")).json()["runtime_class"] == "gvisor"
        named = await h.attach(token, "v", json={"class": "vm"})
        assert named.status_code == 200
        assert named.json()["runtime_class"] == "vm"
        assert list(drivers["vm"].machines)
    for d in drivers.values():
        await d.close_all()


async def test_a_pin_decides_default(tmp_path):
    drivers = two_classes(tmp_path)
    async for h in run(tmp_path, drivers, classes="gvisor,container", pin="container"):
        token = await h.deployment()
        assert (await h.attach(token, "p")).json()["runtime_class"] == "container"
    for d in drivers.values():
        await d.close_all()


async def test_a_pinned_default_that_cannot_run_refuses_new_sandboxes_only(tmp_path):
    drivers = two_classes(tmp_path)
    down = {"gvisor": HostCheck(False, False, "gVisor cannot start here")}
    async for h in run(tmp_path, drivers, classes="gvisor,container", pin="gvisor", results=down):
        token = await h.deployment()
        r = await h.attach(token, "p")
        assert r.status_code == 409
        assert r.json()["code"] == "SANDBOX_CLASS_UNAVAILABLE"
        assert "'default' (pinned to 'gvisor')" in r.json()["error"]
        assert (await h.attach(token, "c", json={"class": "container"})).status_code == 200
        # An existing sandbox is reused with "default": the pin decides new ones only.
        assert (await h.attach(token, "c")).json()["start"] == "reused"
    for d in drivers.values():
        await d.close_all()


async def test_restart_adopts_each_class_from_its_own_driver(tmp_path):
    drivers = two_classes(tmp_path)
    async for h in run(tmp_path, drivers, classes="gvisor,container"):
        token = await h.deployment()
        g = (await h.attach(token, "g")).json()
        c = (await h.attach(token, "c", json={"class": "container"})).json()
    async for h in run(tmp_path, drivers, classes="gvisor,container"):
        for handle in (g, c):
            r = await h.client.get(handle["endpoint"] + "/v1/info", headers=handle["headers"])
            assert r.status_code == 200, (handle["runtime_class"], r.text)
        assert len(drivers["gvisor"].machines) == 1
        assert len(drivers["container"].machines) == 1
    # A restart without gvisor leaves its sandbox alone (row and machine) ...
    async for h in run(tmp_path, drivers, classes="container"):
        r = await h.client.get(g["endpoint"] + "/v1/info", headers=g["headers"])
        assert r.status_code == 401
        assert r.json()["code"] == "SANDBOX_NOT_RUNNING"
        await h.platform.lifecycle.run_pass()
        assert len(drivers["gvisor"].machines) == 1
        listed = (await h.call("GET", "/api/v1/sandboxes", token)).json()["sandboxes"]
        assert sorted(s["runtime_class"] for s in listed) == ["container", "gvisor"]
        r = await h.attach(token, "g")
        assert r.status_code == 409
        assert r.json()["code"] == "SANDBOX_CLASS_UNAVAILABLE"
    for d in drivers.values():
        await d.close_all()


async def test_no_driver_at_all_says_why_on_healthz(tmp_path):
    import httpx

    from podbay.serve.platform import create_app
    from podbay.store.sqlite import SqliteStore

    settings = make_settings(tmp_path)
    settings.runtime.classes = "vm"
    store = SqliteStore.open(settings.data_dir / "podbay.db")
    platform = create_app(settings, store, {}, missing={"vm": "no module podbay.runtime.vm"})
    transport = httpx.ASGITransport(app=platform)
    async with (
        platform.control.router.lifespan_context(platform.control),
        httpx.AsyncClient(transport=transport, base_url="http://podbay.test") as client,
    ):
        health = await client.get("/healthz")
    await store.close()
    assert health.status_code == 503
    assert health.json()["error"] == (
        "no sandbox class can run here: vm: no module podbay.runtime.vm"
    )


async def test_a_slow_class_is_proven_in_the_background_while_the_server_serves(tmp_path):
    (tmp_path / "vm").mkdir()
    drivers = {"vm": FakeDriver(tmp_path / "vm"), **two_classes(tmp_path)}
    booted = asyncio.Event()

    async def prove(name: str, driver: Driver) -> str:
        if name == "vm":
            await booted.wait()  # a guest booting under TCG
        return f"a {name} machine answered"

    tcg = {"vm": HostCheck(True, False, "TCG only")}
    async for h in run(tmp_path, drivers, classes="vm,gvisor,container", results=tcg, prove=prove):
        assert h.platform.ready
        assert h.platform.classes.default == "gvisor"
        token = await h.deployment()
        early = await h.attach(token, "v", json={"class": "vm"})
        assert early.status_code == 503
        assert early.json()["code"] == "SANDBOXES_UNAVAILABLE"
        assert "still being checked" in early.json()["error"]
        # Temporary, and said so: clients wait Retry-After and ask again; /healthz
        # says the same (checking, not available; container too: the background
        # proves one class after another).
        assert early.headers["Retry-After"] == str(CHECKING_RETRY_SECONDS)
        health = (await h.client.get("/healthz")).json()["classes"]
        assert health["checking"] == ["vm", "container"]
        assert "vm" not in health["available"]
        assert (await h.attach(token, "d")).json()["runtime_class"] == "gvisor"
        booted.set()
        for _ in range(100):
            if "vm" in h.platform.classes.available:
                break
            await asyncio.sleep(0.01)
        late = await h.attach(token, "v", json={"class": "vm"})
        assert late.status_code == 200
        assert late.json()["runtime_class"] == "vm"
        status = {s.name: s for s in h.platform.classes.statuses()}
        assert status["vm"].available
        assert "a vm machine answered" in status["vm"].detail
    for d in drivers.values():
        await d.close_all()


async def test_when_the_default_candidate_cannot_run_a_machine_the_next_one_is_default(tmp_path):
    drivers = two_classes(tmp_path)

    async def prove(name: str, driver: Driver) -> str:
        if name == "gvisor":
            raise RuntimeError("runsc run failed: flag provided but not defined")
        return "ok"

    async for h in run(tmp_path, drivers, classes="gvisor,container", prove=prove):
        assert h.platform.classes.default == "container"
        token = await h.deployment()
        r = await h.attach(token, "g", json={"class": "gvisor"})
        assert r.status_code == 409
        assert "flag provided but not defined" in r.json()["error"]
    for d in drivers.values():
        await d.close_all()


async def test_a_class_proven_late_takes_up_its_machines_after_a_restart(tmp_path):
    (tmp_path / "vm").mkdir()
    drivers = {"vm": FakeDriver(tmp_path / "vm"), **two_classes(tmp_path)}
    tcg = {"vm": HostCheck(True, False, "TCG only")}
    async for h in run(tmp_path, drivers, classes="vm,gvisor,container", results=tcg):
        token = await h.deployment()
        v = (await h.attach(token, "v", json={"class": "vm"})).json()
    booted = asyncio.Event()

    async def prove(name: str, driver: Driver) -> str:
        if name == "vm":
            await booted.wait()
        return "ok"

    async for h in run(tmp_path, drivers, classes="vm,gvisor,container", results=tcg, prove=prove):
        # Not routed while its class is unproven: the call is held (it answered
        # 401 there), and answered once the class took its machine up.
        call = asyncio.ensure_future(h.client.get(v["endpoint"] + "/v1/info", headers=v["headers"]))
        await asyncio.sleep(0.05)
        assert not call.done()
        booted.set()
        r = await call
        assert r.status_code == 200, r.text
    for d in drivers.values():
        await d.close_all()


async def test_class_is_the_callers_word_and_runtime_class_the_class_that_runs(both):
    """The reference client's handles say "Always ``default``": ``class`` echoes
    what attach was asked (``default`` when nothing was), in the handle and in
    the records; ``runtime_class`` says what runs."""
    h, _ = both
    token = await h.deployment()
    none_given = (await h.attach(token, "n")).json()
    assert (none_given["class"], none_given["runtime_class"]) == ("default", "gvisor")
    said_default = (await h.attach(token, "d", json={"class": "default"})).json()
    assert (said_default["class"], said_default["runtime_class"]) == ("default", "gvisor")
    named = (await h.attach(token, "c", json={"class": "container"})).json()
    assert (named["class"], named["runtime_class"]) == ("container", "container")
    # Reattaching with `default` answers `default`: a handle carries this call's word.
    again = (await h.attach(token, "c")).json()
    assert (again["class"], again["runtime_class"]) == ("default", "container")
    for name, word, runs in (
        ("n", "default", "gvisor"),
        ("d", "default", "gvisor"),
        ("c", "container", "container"),
    ):
        record = (await h.call("GET", f"/api/v1/sandboxes/{name}", token)).json()
        assert (record["class"], record["runtime_class"]) == (word, runs)
    listed = (await h.call("GET", "/api/v1/sandboxes", token)).json()["sandboxes"]
    assert sorted((s["name"], s["class"], s["runtime_class"]) for s in listed) == [
        ("c", "container", "container"),
        ("d", "default", "gvisor"),
        ("n", "default", "gvisor"),
    ]
