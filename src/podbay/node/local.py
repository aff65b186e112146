"""The node in process: what ``podbay serve`` (and ``podbay node``) holds.

Every call is a method call on the drivers, the warm pools, the gateway's
route table and its activity tracker, in this process: no serialization, so
the all-in-one server is exactly as fast as before the interface existed.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import replace
from datetime import datetime

import httpx

from podbay.dataplane import nodeapi
from podbay.dataplane.activity import ActivityTracker
from podbay.dataplane.classes import ClassRuntimes
from podbay.dataplane.environment_seam import Building, EnvironmentService, Prepared
from podbay.dataplane.oom import OomTally
from podbay.dataplane.orders import Launch, Transfer
from podbay.dataplane.routes import RouteTable
from podbay.domain import Deployment, Sandbox
from podbay.domain.egress import EgressDestination, EgressPolicy
from podbay.errors import ApiError, DriverError, PodbayError
from podbay.host.machine import VolumeBind
from podbay.host.volumes import VolumeStore
from podbay.runtime.agent_client import AgentClient
from podbay.runtime.base import (
    Driver,
    ForkCopy,
    ForkingDriver,
    Limits,
    MachineSpec,
    MachineState,
    MovableDriver,
    ObservedMachine,
)
from podbay.runtime.hostdisk import reserve_shortfall
from podbay.runtime.transfer import Received
from podbay.runtime.usage import MeasuredDriver, Usage
from podbay.settings import Settings
from podbay.wire.codes import ErrorCode
from podbay.wire.observe import MAX_COMMANDS, CommandEntry, MetricSample, bounded_argv
from podbay.wire.paths import SHARE_PREFIX, sandbox_endpoint

from .observe import Sampler
from .pool import WarmPool

log = logging.getLogger("podbay.node")
#: How long a command log read waits for the agent.
COMMANDS_SECONDS = 5.0


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
        volumes: VolumeStore | None = None,
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
        #: The running sandboxes' metrics (what this node routes).
        self.sampler = Sampler(self._usage)
        self._oom_tally = OomTally()
        #: Each sandbox's command log as last read from its agent.
        self._commands: dict[str, list[CommandEntry]] = {}
        #: This host's volumes (docs/volumes.md); None: it keeps none.
        self.volumes = volumes

    def driver(self, class_: str) -> Driver:
        return self.classes.driver(self.classes.require(class_))

    def endpoint(self, sandbox_id: str) -> str:
        return sandbox_endpoint(self.base_url, sandbox_id)

    def share_base(self) -> str:
        return f"{self.base_url}{SHARE_PREFIX}"

    # -- capacity -----------------------------------------------------------------
    async def shortfall(self) -> str | None:
        return self._shortfall()

    def can_suspend(self, class_: str) -> bool:
        return self.driver(class_).capabilities.suspend

    def can_fork(self, class_: str) -> bool:
        driver = self.driver(class_)
        return driver.capabilities.fork and isinstance(driver, ForkingDriver)

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
            binds = await self._volume_binds(order, deployment)
            await driver.create(
                MachineSpec(
                    machine_id=order.machine_id,
                    hostname=order.hostname,
                    limits=order.limits(self.limits),
                    env={**prepared.env, **order.env},
                    layers=prepared.layers,
                    labels=order.labels,
                    egress=order.egress,
                    volumes=binds,
                )
            )
            await driver.start(order.machine_id)
        await self.environment.apply(deployment, driver, order.machine_id)
        self._launched.add(order.machine_id)

    async def _volume_binds(self, order: Launch, deployment: Deployment) -> tuple[VolumeBind, ...]:
        """The order's volumes as this host's directories, each mounted."""
        if not order.volumes:
            return ()
        if self.volumes is None:
            raise ApiError(ErrorCode.VOLUMES_UNAVAILABLE, "this node keeps no volumes")
        return tuple(
            [
                VolumeBind(
                    await self.volumes.mounted_data(deployment.id, v.name),
                    v.path,
                    v.read_only,
                    self.volumes.disk(deployment.id, v.name),
                )
                for v in order.volumes
            ]
        )

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
        for sandbox_id in self.sampler.forget_machine(machine_id):
            self._commands.pop(sandbox_id, None)
        await self.driver(class_).destroy(machine_id)

    async def state(self, class_: str, machine_id: str) -> MachineState:
        return await self.driver(class_).state(machine_id)

    async def fork(self, class_: str, source_id: str, copies: list[ForkCopy]) -> float:
        driver = self.driver(class_)
        if not driver.capabilities.fork or not isinstance(driver, ForkingDriver):
            raise ApiError(
                ErrorCode.SANDBOX_FORK_UNSUPPORTED,
                f"class {class_!r} cannot copy its sandboxes on node {self.name}",
            )
        short = self._shortfall()
        if short is not None:
            raise ApiError(ErrorCode.HOST_DISK_FULL, short)
        held = await driver.fork(source_id, copies)
        # Their first route warms their agent connection, as a launch's does.
        self._launched.update(copy.machine_id for copy in copies)
        return held

    async def set_egress(self, class_: str, machine_id: str, egress: EgressPolicy) -> None:
        await self.driver(class_).set_egress(machine_id, egress)

    async def egress_audit(self, class_: str, machine_id: str) -> list[EgressDestination]:
        return await self.driver(class_).egress_audit(machine_id)

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
            f"{transfer.source_url.rstrip('/')}{nodeapi.DISKS}/"
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
        self.sampler.watch(sandbox.id, sandbox.class_, sandbox.machine_id)

    async def withdraw(self, sandbox_id: str) -> None:
        self.routes.remove(sandbox_id)
        self.sampler.unwatch(sandbox_id)

    def routed(self, sandbox: Sandbox) -> bool:
        route = self.routes.get(sandbox.id)
        return route is not None and route.incarnation == sandbox.incarnation

    # -- observation ----------------------------------------------------------------
    async def _usage(self, class_: str, machine_id: str) -> Usage | None:
        driver = self.classes.driver(class_)
        return await driver.usage(machine_id) if isinstance(driver, MeasuredDriver) else None

    async def metrics(self, sandbox_id: str, since: datetime | None) -> list[MetricSample]:
        return self.sampler.samples(sandbox_id, since)

    async def latest_metrics(self) -> dict[str, MetricSample]:
        return self.sampler.latest()

    async def new_oom_kills(self) -> dict[str, tuple[datetime, int]]:
        return self._oom_tally.new(self.sampler.oom_kills())

    async def commands(self, sandbox: Sandbox) -> list[CommandEntry]:
        return await self.commands_of(
            sandbox.id, sandbox.class_, sandbox.machine_id, sandbox.incarnation
        )

    async def commands_of(
        self, sandbox_id: str, class_: str, machine_id: str, incarnation: int
    ) -> list[CommandEntry]:
        """The machine's command log from its agent while it runs (kept here
        too, so a suspended sandbox's, whose agent is frozen, is still read)."""
        route = self.routes.get(sandbox_id)
        if route is not None and route.incarnation == incarnation:
            socket = self.driver(class_).agent_socket(machine_id)
            client = AgentClient(socket, timeout=COMMANDS_SECONDS)
            try:
                listing = await asyncio.to_thread(client.commands)
            except (PodbayError, OSError) as exc:
                log.warning("sandbox %s: no command log from its agent: %s", sandbox_id, exc)
            else:
                # The agent's answer is the sandbox's to shape: held to the log's bounds.
                self._commands[sandbox_id] = [
                    replace(c, argv=bounded_argv(c.argv)) for c in listing.commands[-MAX_COMMANDS:]
                ]
        return self._commands.get(sandbox_id, [])

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


def host_node(
    settings: Settings,
    drivers: Mapping[str, Driver],
    *,
    name: str,
    base_url: str,
    environment: EnvironmentService,
    missing: Mapping[str, str] | None = None,
    activity: ActivityTracker | None = None,
    on_pool_change: Callable[[int], None] | None = None,
) -> LocalNode:
    """This host's node, as ``podbay serve`` and ``podbay node`` both hold it:
    the enabled classes' ``drivers`` (``missing``: why a class has none), a
    warm pool of each (``runtime.warm_pool``), the route table and activity the
    gateway shares, the machines' default limits and the disk reserve."""
    classes = ClassRuntimes.from_settings(settings, drivers, missing)
    rt = settings.runtime
    limits = Limits.of(rt)
    shortfall = functools.partial(reserve_shortfall, settings.data_dir, rt.disk_reserve_bytes)
    pools = {
        class_: WarmPool(
            driver, limits, rt.warm_pool, on_change=on_pool_change, shortfall=shortfall
        )
        for class_, driver in classes.drivers.items()
        if rt.warm_pool > 0
    }
    return LocalNode(
        name=name,
        base_url=base_url,
        classes=classes,
        environment=environment,
        pools=pools,
        routes=RouteTable(
            requests=settings.server.sandbox_requests,
            queue=settings.server.sandbox_queue,
            websockets=settings.server.sandbox_websockets,
        ),
        activity=activity or ActivityTracker(),
        limits=limits,
        shortfall=shortfall,
        room=shortfall,
        volumes=VolumeStore.from_settings(settings),
    )
