"""Attach holds the request while a declared environment builds: a build that
ends within the hold is answered 200 (clients that predate 202 work), one that
does not is answered 202 at the bound."""

from __future__ import annotations

import asyncio
import dataclasses

import httpx
import pytest
from platform_harness import make_settings
from test_control_environment_seam import ScriptedEnvironment

from podbay.dataplane.environment_seam import Building
from podbay.domain.options import NO_OPTIONS
from podbay.serve.platform import create_app
from podbay.store.sqlite import SqliteStore
from podbay.testing.fake_driver import Clock, FakeDriver

pytestmark = pytest.mark.anyio


async def _attach(tmp_path, env, hold, headers=()):  # type: ignore[no-untyped-def]
    settings = make_settings(tmp_path)
    settings = dataclasses.replace(
        settings, server=dataclasses.replace(settings.server, attach_hold_seconds=hold)
    )
    driver = FakeDriver(tmp_path)
    store = SqliteStore.open(settings.data_dir / "podbay.db")
    platform = create_app(settings, store, {"container": driver}, environment=env, clock=Clock())
    try:
        async with platform.control.router.lifespan_context(platform.control):
            while not platform.ready:  # noqa: ASYNC110 - a flag, not an event
                await asyncio.sleep(0.01)
            _, token = await platform.deployments.create("d", "sandbox:\n  toolchain: x\n")
            async with httpx.AsyncClient(
                transport=httpx.ASGITransport(app=platform), base_url="http://podbay.test"
            ) as client:
                return await client.put(
                    "/api/v1/sandboxes/s",
                    headers={"Authorization": f"Bearer {token}", **dict(headers)},
                )
    finally:
        await driver.close_all()
        await store.close()


async def test_a_build_ending_within_the_hold_answers_200(tmp_path):
    env = ScriptedEnvironment()
    build = asyncio.get_running_loop().create_future()
    asyncio.get_running_loop().call_later(0.2, build.set_result, None)
    env.prepares = [Building(retry_after_seconds=5, done=build)]
    response = await _attach(tmp_path, env, hold=20)
    assert response.status_code == 200
    assert response.json()["start"] == "created"


async def test_a_longer_build_answers_202_at_the_bound(tmp_path):
    env = ScriptedEnvironment()
    build = asyncio.get_running_loop().create_future()  # never ends
    env.prepares = [Building(retry_after_seconds=5, done=build)] * 2
    response = await _attach(tmp_path, env, hold=0.2)
    assert response.status_code == 202
    assert response.headers["retry-after"] == "5"


async def test_a_client_that_handles_202_gets_it_at_once(tmp_path):
    env = ScriptedEnvironment()
    build = asyncio.get_running_loop().create_future()
    asyncio.get_running_loop().call_later(0.2, build.set_result, None)
    env.prepares = [Building(retry_after_seconds=5, done=build)]
    response = await _attach(tmp_path, env, hold=20, headers={"Prefer": "respond-async"})
    assert response.status_code == 202


async def test_the_sandbox_service_holds_an_attach_until_its_build_ends(tmp_path):
    # The hold is the sandbox service's, not the route's: any surface over it
    # (the API, E2B's) gets a build that ends within the hold as attached.
    settings = make_settings(tmp_path)
    driver = FakeDriver(tmp_path)
    store = SqliteStore.open(settings.data_dir / "podbay.db")
    env = ScriptedEnvironment()
    build = asyncio.get_running_loop().create_future()
    env.prepares = [Building(retry_after_seconds=5, done=build)]
    platform = create_app(settings, store, {"container": driver}, environment=env, clock=Clock())
    try:
        async with platform.control.router.lifespan_context(platform.control):
            while not platform.ready:  # noqa: ASYNC110 - a flag, not an event
                await asyncio.sleep(0.01)
            deployment, _ = await platform.deployments.create("d", "sandbox:\n  toolchain: x\n")
            asyncio.get_running_loop().call_later(0.2, build.set_result, None)
            held = await platform.sandboxes.attach_holding(
                deployment, "s", "default", NO_OPTIONS, 20
            )
            assert not isinstance(held, Building)
            assert held.start == "created"
            # No hold: the build under way is answered at once.
            env.prepares = [Building(retry_after_seconds=5, done=asyncio.Future())]
            other = await platform.sandboxes.attach_holding(
                deployment, "t", "default", NO_OPTIONS, 0
            )
            assert isinstance(other, Building)
            assert other.retry_after_seconds == 5
    finally:
        await driver.close_all()
        await store.close()


def test_the_sdk_says_it_handles_202() -> None:
    from podbay.client._core import Core, resolve_config

    core = Core(resolve_config("t", "http://x", 30, 60, "auto"))
    assert core.attach_request("s").headers["prefer"] == "respond-async"
