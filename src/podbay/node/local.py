"""The node in process: what ``podbay serve`` (and ``podbay node``) holds.

Every call is a method call on the drivers, the warm pools, the gateway's
route table and its activity tracker, in this process: no serialization, so
the all-in-one server is exactly as fast as before the interface existed.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping
from datetime import datetime

import httpx

from podbay import internal
from podbay.control.nodes import Launch, Transfer
from podbay.control.services.classes import ClassRuntimes
from podbay.control.services.environment import Building, EnvironmentService, Prepared
from podbay.control.services.pool import WarmPool
from podbay.domain import Deployment, Sandbox
from podbay.errors import ApiError, DriverError
from podbay.gateway.activity import ActivityTracker
from podbay.gateway.app import endpoint_for
from podbay.gateway.routes import RouteTable
from podbay.runtime.base import (
    Driver,
    Limits,
    MachineSpec,
    MachineState,
    MovableDriver,
    ObservedMachine,
)
from podbay.runtime.transfer import Received
from podbay.wire.codes import ErrorCode
from podbay.wire.paths import SHARE_PREFIX


class LocalNode:
    #: Its routes are this process's table: no row mark to write or clear.
    marks_routes = False

    def __init__(
        self,
        *,
        name: str,
        base_url: str,
        classes: ClassRuntimes,
        environment: EnvironmentService,
        pools: Mapping[str, WarmPool],
        routes: RouteTable,
        activity: ActivityTracker,
        limits: Limits,
        shortfall: Callable[[], str | None],
        room: Callable[[int], str | None] | None = None,
    ) -> None:
        self.name = name
        self.base_url = base_url.rstrip("/")
        self.classes = classes
        self.environment = environment
        self.pools = pools
        self.routes = routes
        self.activity = activity
        self.limits = limits
        self._shortfall = shortfall
        #: Machines launched here whose route is not published yet.
        self._launched: set[str] = set()
        #: Why a disk of so many bytes may not move here (its disk reserve), or None.
        self._room = room

    def driver(self, class_: str) -> Driver:
        return self.classes.driver(self.classes.require(class_))

    def endpoint(self, sandbox_id: str) -> str:
        return endpoint_for(self.base_url, sandbox_id)

    def share_base(self) -> str:
        return f"{self.base_url}{SHARE_PREFIX}"

    # -- capacity -----------------------------------------------------------------
    async def shortfall(self) -> str | None:
        return self._shortfall()

    def can_suspend(self, class_: str) -> bool:
        return self.driver(class_).capabilities.suspend

    # -- machines -------------------------------------------------------------------
    async def prepare(self, deployment: Deployment, class_: str) -> Prepared | Building:
        return await self.environment.prepare(deployment, class_)

    async def take_warm(self, class_: str, prepared: Prepared) -> str | None:
        pool = self.pools.get(class_)
        return pool.take(prepared) if pool is not None else None

    async def give_back(self, class_: str, prepared: Prepared, machine_id: str) -> None:
        pool = self.pools.get(class_)
        if pool is not None:
            pool.give_back(prepared, machine_id)

    async def launch(self, order: Launch, prepared: Prepared, deployment: Deployment) -> None:
        driver = self.driver(order.class_)
        if order.pooled:
            await driver.assign(order.machine_id, hostname=order.hostname, labels=order.labels)
        else:
            await driver.create(
                MachineSpec(
                    machine_id=order.machine_id,
                    hostname=order.hostname,
                    limits=order.limits(self.limits),
                    env={**prepared.env, **order.env},
                    layers=prepared.layers,
                    labels=order.labels,
                )
            )
            await driver.start(order.machine_id)
        await self.environment.apply(deployment, driver, order.machine_id)
        self._launched.add(order.machine_id)

    async def start(self, class_: str, machine_id: str) -> None:
        await self.driver(class_).start(machine_id)

    async def suspend(self, class_: str, machine_id: str) -> None:
        await self.driver(class_).suspend(machine_id)

    async def resume(self, class_: str, machine_id: str) -> None:
        await self.driver(class_).resume(machine_id)

    async def stop(self, class_: str, machine_id: str) -> None:
        await self.driver(class_).stop(machine_id)

    async def destroy(self, class_: str, machine_id: str) -> None:
        self._launched.discard(machine_id)
        await self.driver(class_).destroy(machine_id)

    async def state(self, class_: str, machine_id: str) -> MachineState:
        return await self.driver(class_).state(machine_id)

    async def adopt(self) -> dict[str, list[ObservedMachine]]:
        return {name: await driver.adopt() for name, driver in self.classes.running().items()}

    def movable(self, class_: str) -> MovableDriver:
        """The driver of ``class_`` if its machines can move between nodes."""
        driver = self.driver(class_)
        if not driver.capabilities.move or not isinstance(driver, MovableDriver):
            raise ApiError(
                ErrorCode.REQUEST_INVALID, f"class {class_!r} cannot move machines between nodes"
            )
        return driver

    async def receive(self, transfer: Transfer, prepared: Prepared) -> Received:
        driver = self.movable(transfer.class_)
        short = self._shortfall()
        if short is not None:
            raise ApiError(ErrorCode.HOST_DISK_FULL, short)
        url = (
            f"{transfer.source_url.rstrip('/')}{internal.DISKS}/"
            f"{transfer.class_}/{transfer.machine_id}"
        )
        headers = {"Authorization": f"Bearer {transfer.token}"}
        timeout = httpx.Timeout(60.0, connect=5.0)
        async with (
            httpx.AsyncClient(timeout=timeout) as client,
            client.stream("GET", url, headers=headers) as r,
        ):
            if r.status_code != 200:
                await r.aread()
                raise DriverError(
                    f"the node holding machine {transfer.machine_id} refused its disk "
                    f"({r.status_code}): {r.text[:300]}"
                )
            chunks: AsyncIterator[bytes] = r.aiter_raw()
            return await driver.import_disk(
                transfer.machine_id,
                chunks,
                layers=prepared.layers,
                env={**prepared.env, **transfer.env},
                room=self._room,
            )

    async def adopt_class(self, class_: str) -> dict[str, list[ObservedMachine]]:
        return {class_: await self.classes.driver(class_).adopt()}

    # -- routes ---------------------------------------------------------------------
    async def publish(self, sandbox: Sandbox) -> None:
        self.publish_now(sandbox)  # routed() reads the table: nothing to record
        if sandbox.machine_id in self._launched:
            # A new sandbox's first route: its agent connection is opened and
            # warmed before the attach is answered, not on the owner's first call.
            self._launched.discard(sandbox.machine_id)
            await self.routes.ready(sandbox.id)

    def publish_now(self, sandbox: Sandbox) -> None:
        self.routes.add(
            sandbox.id,
            sandbox.machine_id,
            sandbox.incarnation,
            self.driver(sandbox.class_).agent_socket(sandbox.machine_id),
        )

    async def withdraw(self, sandbox_id: str) -> None:
        self.routes.remove(sandbox_id)

    def routed(self, sandbox: Sandbox) -> bool:
        route = self.routes.get(sandbox.id)
        return route is not None and route.incarnation == sandbox.incarnation

    # -- activity -------------------------------------------------------------------
    def touch(self, sandbox_id: str) -> None:
        self.activity.touch(sandbox_id)

    def last_seen(self, sandbox_id: str) -> datetime | None:
        return self.activity.last(sandbox_id)

    def busy(self, sandbox_id: str) -> bool:
        return self.activity.busy(sandbox_id)

    async def drain_activity(self) -> dict[str, datetime]:
        return self.activity.drain()

    def restore_activity(self, seen: Mapping[str, datetime]) -> None:
        self.activity.restore(dict(seen))
