"""The platform in process over a fake driver: settings, a harness, a runner."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import httpx

from podbay.dataplane.classes import ClassCheck, ClassProof
from podbay.serve.platform import Platform, create_app
from podbay.settings import Settings
from podbay.store.sqlite import SqliteStore
from podbay.testing.fake_driver import Clock, FakeDriver


@dataclass
class Harness:
    platform: Platform
    driver: FakeDriver
    clock: Clock
    client: httpx.AsyncClient
    store: SqliteStore
    settings: Settings

    async def deployment(
        self, name: str = "agent", *, sandbox: bool = True, account: str = "default"
    ) -> str:
        spec = "name: x\nsandbox:\n  toolchain: never\n" if sandbox else "name: x\n"
        _, token = await self.platform.deployments.create(name, spec, account)
        return token

    async def attach(self, token: str, name: str, **kw: object) -> httpx.Response:
        return await self.client.put(
            f"/api/v1/sandboxes/{name}", headers={"Authorization": f"Bearer {token}"}, **kw
        )

    async def call(self, method: str, path: str, token: str, **kw: object) -> httpx.Response:
        return await self.client.request(
            method, path, headers={"Authorization": f"Bearer {token}"}, **kw
        )


def make_settings(tmp: Path, **lifecycle: float) -> Settings:
    settings = Settings.load(environ={}, data_dir=tmp / "data")
    settings.server.public_url = "http://podbay.test"
    settings.runtime.warm_pool = 0
    settings.runtime.classes = "container"
    settings.caps.per_deployment = 5
    settings.caps.per_account = 8
    settings.lifecycle.idle_seconds = lifecycle.get("idle", 60)
    settings.lifecycle.suspended_ttl_seconds = lifecycle.get("ttl", 600)
    settings.lifecycle.max_age_seconds = lifecycle.get("max_age", 3600)
    settings.lifecycle.interval_seconds = 3600  # passes are run by hand
    return settings


def build_harness(
    tmp_path: Path,
    settings: Settings | None = None,
    driver: FakeDriver | None = None,
    *,
    drivers: Mapping[str, FakeDriver] | None = None,
    check: ClassCheck | None = None,
    prove: ClassProof | None = None,
):  # type: ignore[no-untyped-def]
    """One fake ``container`` driver, or ``drivers`` by class (whose classes the
    settings must enable); ``Harness.driver`` is the ``container`` one."""

    @contextlib.asynccontextmanager
    async def run() -> AsyncIterator[Harness]:
        s = settings or make_settings(tmp_path)
        by_class = dict(drivers or {"container": driver or FakeDriver(tmp_path)})
        d = by_class["container"]
        store = SqliteStore.open(s.data_dir / "podbay.db")
        clock = Clock()
        platform = create_app(s, store, by_class, clock=clock, check=check, prove=prove)
        transport = httpx.ASGITransport(app=platform)
        async with platform.control.router.lifespan_context(platform.control):
            for _ in range(100):
                if platform.ready:
                    break
                await asyncio.sleep(0.01)
            async with httpx.AsyncClient(
                transport=transport, base_url="http://podbay.test"
            ) as client:
                yield Harness(platform, d, clock, client, store, s)
        if driver is None and drivers is None:  # passed-in drivers outlive the harness
            await d.close_all()
        await store.close()

    return run()
