"""Compose the all-in-one platform: ``create_app(settings, store, drivers)``,
``drivers`` naming each enabled sandbox class's driver (``{"container": ...}``).

This is the wiring above both planes: it builds the node (drivers, warm
pools, the gateway's route table and activity) as a
:class:`~podbay.node.local.LocalNode`, and the control plane's services,
which reach that node only through :class:`~podbay.control.nodes.Nodes`.
One ASGI app serves the control plane (``/api/v1``, ``/healthz``,
``/metrics``) and the gateway (``/sandbox/<id>/...``). Nothing is built at
import; everything here is built by the caller (``podbay serve``, a test).

Start-up runs in the background so ``/healthz`` can answer 503 meanwhile:
each class's driver ``prepare()`` (base image) and check (which classes run
here, what ``default`` means), then reconcile the store with what the
drivers adopt, then the default class's warm pool fills and the lifecycle
loop starts. Other classes' pools fill after their first sandbox.
Shutdown leaves sandboxes running; the next start adopts them.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from starlette.applications import Starlette

from podbay.asgi import ASGIApp, Message, Receive, Scope, Send
from podbay.e2b.app import E2BApps
from podbay.errors import ApiError
from podbay.gateway.activity import ActivityTracker
from podbay.gateway.app import PREFIX as GATEWAY_PREFIX
from podbay.gateway.app import Gateway
from podbay.gateway.credentials import Credential, CredentialVerifier, mint_credential
from podbay.gateway.proxy import send_error
from podbay.gateway.routes import RouteTable
from podbay.node.local import LocalNode
from podbay.runtime.base import Driver, Limits
from podbay.runtime.hostdisk import reserve_shortfall
from podbay.settings import Settings
from podbay.store.base import Store
from podbay.wire.codes import ErrorCode
from podbay.wire.limits import MAX_CONTROL_BODY
from podbay.wire.paths import REQUEST_ID_HEADER, SHARE_PREFIX

from . import errors
from .bodies import BodyLimit
from .hosting import release_machines, stop_tasks
from .keys import KeyRing, StoreKeyRing
from .logs import RequestIdMiddleware
from .metrics import Metrics
from .nodes import OneNode
from .routes import health, openapi, sandboxes
from .services.classes import ClassCheck, ClassProof, ClassRuntimes
from .services.deletions import DeletionWatch, marker_path
from .services.deployments import PUBLIC_URL_KEY, DeploymentService, SectionValidator
from .services.environment import EnvironmentService, PlainEnvironment, Prepared
from .services.lifecycle import Lifecycle, build_lifecycle
from .services.locks import NameLocks
from .services.pool import WarmPool
from .services.sandboxes import SandboxService
from .services.transitions import Transitions

log = logging.getLogger("podbay.serve")
#: Paths the gateway serves; everything else is the control plane's.
GATEWAY_PATHS = (GATEWAY_PREFIX, "/v1/", SHARE_PREFIX)


def _request_id(scope: Scope) -> str:
    wanted = REQUEST_ID_HEADER.lower().encode()
    for key, value in scope["headers"]:
        if key == wanted:
            return str(value.decode("latin-1"))
    return uuid.uuid4().hex


def _utcnow() -> datetime:
    return datetime.now(UTC)


class Platform:
    """Everything one ``podbay serve`` holds, and the ASGI entry point."""

    def __init__(
        self,
        settings: Settings,
        store: Store,
        drivers: Mapping[str, Driver],
        *,
        keys: KeyRing | StoreKeyRing | None = None,
        environment: EnvironmentService | None = None,
        validate_section: SectionValidator | None = None,
        clock: Callable[[], datetime] = _utcnow,
        check: ClassCheck | None = None,
        prove: ClassProof | None = None,
        missing: Mapping[str, str] | None = None,
    ) -> None:
        self.settings = settings
        self.store = store
        self.base_url = settings.server.base_url()
        self.keys = keys or KeyRing.open(settings.data_dir / "keys")
        self.metrics = Metrics()
        #: ``missing``: why an enabled class has no driver (e.g. its module is absent).
        self.classes = ClassRuntimes.from_settings(settings, drivers, missing)
        self._check = check
        self._prove = prove
        self.activity = ActivityTracker(clock)
        self.routes = RouteTable(
            requests=settings.server.sandbox_requests, queue=settings.server.sandbox_queue
        )
        self.locks = NameLocks()
        self.environment = environment or PlainEnvironment()
        self.ready = False
        self.startup_error: str | None = None
        self._tasks: list[asyncio.Task[Any]] = []
        #: Checks of machines whose agent went quiet, by sandbox id.
        self._checking: dict[str, asyncio.Task[None]] = {}
        rt = settings.runtime
        self.limits = Limits(
            memory_bytes=rt.memory_bytes, cpus=rt.cpus, pids=rt.pids, disk_bytes=rt.disk_bytes
        )
        self.transitions: Transitions | None = None
        #: Warm pools by class; a class found unable to run here loses its pool.
        self.pools: dict[str, WarmPool] = {}
        self.lifecycle: Lifecycle | None = None
        self.node = LocalNode(
            name="local",
            base_url=self.base_url,
            classes=self.classes,
            environment=self.environment,
            pools=self.pools,
            routes=self.routes,
            activity=self.activity,
            limits=self.limits,
            shortfall=functools.partial(
                reserve_shortfall, settings.data_dir, rt.disk_reserve_bytes
            ),
        )
        self.nodes = OneNode(self.node, self.classes)
        if self.classes.drivers:
            self.transitions, self.lifecycle = build_lifecycle(
                store, self.nodes, self.metrics, self.locks, settings.lifecycle, clock
            )
            if rt.warm_pool > 0:
                self.pools.update(
                    (
                        name,
                        WarmPool(
                            driver,
                            self.limits,
                            rt.warm_pool,
                            on_change=self._pool_changed,
                            shortfall=functools.partial(
                                reserve_shortfall, settings.data_dir, rt.disk_reserve_bytes
                            ),
                        ),
                    )
                    for name, driver in self.classes.drivers.items()
                )
        self.deployments = DeploymentService(
            store,
            self.keys,
            issuer=self.base_url,
            identity_ttl_seconds=settings.credentials.identity_ttl_seconds,
            validate_section=validate_section,
            clock=clock,
            deleted_marker=marker_path(settings.data_dir),
            refresh_keys=self.keys.refresh_if_stale
            if isinstance(self.keys, StoreKeyRing)
            else None,
        )
        self.deletions = DeletionWatch(marker_path(settings.data_dir), store, self.nodes)
        ttl = settings.credentials.ttl_seconds
        # Wired as control/cluster.py's ControlPlane wires it, on purpose: the same
        # service from each entry point's own parts (its nodes, locks, minting).
        self.sandboxes = SandboxService(
            settings=settings,
            store=store,
            nodes=self.nodes,
            transitions=self.transitions,
            locks=self.locks,
            clock=clock,
            mint=lambda sid, inc: self._mint(sid, inc, ttl),
        )
        self.sandboxes.settle = self._settle
        self.verifier = CredentialVerifier(self.keys)
        # Wired as node/server.py's NodeServer wires it, on purpose: the same
        # gateway with each process's own hooks (metrics, suspects, deletions).
        self.gateway = Gateway(
            self.verifier,
            self.routes,
            self.activity,
            observe=self.metrics.observe_gateway,
            on_refusal=self.metrics.refused,
            on_unreachable=self._suspect,
            before_route=self.deletions.check,
            default_user=settings.runtime.default_user or None,
            answer_seconds=settings.server.agent_answer_seconds,
            on_silent=functools.partial(self._suspect, silent=True),
        )
        self.control = Starlette(
            routes=[*health.routes, *openapi.routes, *sandboxes.routes],
            exception_handlers=errors.handlers,
            lifespan=self._lifespan,
        )
        self.control.state.platform = self
        self._control = RequestIdMiddleware(BodyLimit(self.control, MAX_CONTROL_BODY))
        # E2B's SDKs (docs/e2b.md): its REST paths and requests naming an E2B sandbox.
        self.e2b = E2BApps(self.store, self.sandboxes, self.limits)

    def _mint(self, sandbox_id: str, incarnation: int, ttl: float) -> tuple[str, datetime]:
        """A data-plane credential, already known to this process's gateway: the
        sandbox's first call then skips the signature check."""
        token, expires = mint_credential(
            self.keys, sandbox_id=sandbox_id, incarnation=incarnation, ttl_seconds=ttl
        )
        self.verifier.remember(token, Credential(sandbox_id, incarnation, expires.timestamp()))
        return token, expires

    def _pool_changed(self, _: int) -> None:
        self.metrics.warm_pool.set(sum(len(pool) for pool in self.pools.values()))

    async def _suspect(self, sandbox_id: str, *, silent: bool = False) -> None:
        """Check, once at a time per sandbox, a machine whose agent went quiet
        (awaited by the gateway before its 502 or 504; the check runs on its
        own). ``silent``: see :meth:`Lifecycle.check`."""
        if self.lifecycle is None or sandbox_id in self._checking:
            return

        async def check() -> None:
            try:
                assert self.lifecycle is not None
                await self.lifecycle.check(sandbox_id, silent=silent)
            except Exception:
                log.exception("checking sandbox %s failed", sandbox_id)
            finally:
                self._checking.pop(sandbox_id, None)

        task = asyncio.get_running_loop().create_task(check())
        # Registered before the client sees its 502: an attach that follows
        # waits for the check (SandboxService.settle) instead of racing it.
        self._checking[sandbox_id] = task
        self._tasks.append(task)
        task.add_done_callback(self._forget_task)

    async def _settle(self, sandbox_id: str) -> bool:
        """Wait for the pending check of ``sandbox_id``, if any; whether there was one."""
        task = self._checking.get(sandbox_id)
        if task is None:
            return False
        await asyncio.shield(task)  # the check logs its own failure
        return True

    def _forget_task(self, task: asyncio.Task[Any]) -> None:
        if task in self._tasks:
            self._tasks.remove(task)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            gateway = scope["type"] == "websocket" and scope["path"].startswith(GATEWAY_PATHS)
            await (self.gateway if gateway else self._control)(scope, receive, send)
            return
        started = False

        async def tracked_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        app: ASGIApp = self.gateway if scope["path"].startswith(GATEWAY_PATHS) else self._control
        app = self.e2b.route(scope) or app
        try:
            await app(scope, receive, tracked_send)
        except asyncio.CancelledError:
            # The server cancels what is still running past its shutdown grace.
            # Answer in the contract's shape (not a bare text/plain 500), so a
            # client re-attaches once the server is back. The request ends here.
            if not started:
                await send_error(
                    send,
                    ApiError(
                        ErrorCode.SERVER_SHUTTING_DOWN,
                        "the server shut down while this request ran; attach again and repeat "
                        "it (a command already started keeps running in the sandbox)",
                    ),
                    _request_id(scope),
                )

    # -- readiness -----------------------------------------------------------------------
    def health(self) -> dict[str, Any]:
        return {
            "ready": self.ready,
            "classes": self.classes.describe(),
            "error": self.startup_error,
        }

    @contextlib.asynccontextmanager
    async def _lifespan(self, app: Starlette) -> AsyncIterator[None]:
        await self.store.set_meta(PUBLIC_URL_KEY, self.base_url)
        self.sandboxes.ready = False
        if self.lifecycle is not None:
            self.routes.hold()  # until the machines the last server left are taken back
            self._tasks.append(asyncio.create_task(self._start_runtime()))
        else:  # not one enabled class has a driver: say why on /healthz
            self.startup_error = "no sandbox class can run here: " + "; ".join(
                f"{s.name}: {s.detail}" for s in self.classes.statuses() if s.enabled
            )
        try:
            yield
        finally:
            await self.shutdown()

    async def _start_runtime(self) -> None:
        assert self.lifecycle is not None
        try:
            await self.classes.start(self._check, self._prove, later=self._class_ready)
            running = self.classes.running()
            await self.lifecycle.reconcile(
                self.node, {name: await driver.adopt() for name, driver in running.items()}
            )
        except Exception as exc:
            log.exception("the runtime could not start")
            self.startup_error = str(exc)
            self.sandboxes.not_ready_reason = f"the sandbox runtime could not start: {exc}"
            self.routes.settle()
            return
        self._tasks.append(asyncio.create_task(self._settle_routes()))
        default_pool = self.pools.get(self.classes.default or "")
        if default_pool is not None:
            default_pool.refill(Prepared(), delay=0.0)
            await default_pool.wait_filled()
        self.ready = self.sandboxes.ready = True
        log.info(
            "ready: sandboxes can be created",
            extra={"classes": list(self.classes.available), "default": self.classes.default},
        )
        self._tasks.append(asyncio.create_task(self.lifecycle.loop(self.keys.reload)))

    async def _settle_routes(self) -> None:
        """Routes are settled once the classes proved after start-up took up
        their machines too (a vm sandbox's credentials are held meanwhile)."""
        try:
            await self.classes.proven()
        finally:
            self.routes.settle()

    async def _class_ready(self, name: str) -> None:
        """A class proved able to run after start-up: take up its machines."""
        assert self.lifecycle is not None
        await self.lifecycle.reconcile(self.node, await self.node.adopt_class(name))

    async def shutdown(self) -> None:
        """Stop background work; sandboxes keep running."""
        await stop_tasks(self.classes, self._tasks)
        await self.e2b.service.close()
        if self.lifecycle is not None:
            with contextlib.suppress(Exception):
                await self.lifecycle.flush_activity()
        await release_machines(self.classes, self.pools, self.routes, self.environment)


def create_app(
    settings: Settings, store: Store, drivers: Mapping[str, Driver], **options: Any
) -> Platform:
    """The whole platform as one ASGI app. ``options``: ``keys``, ``environment``,
    ``validate_section``, ``clock``, ``check``, ``prove``, ``missing`` (see
    :class:`Platform`)."""
    return Platform(settings, store, drivers, **options)
