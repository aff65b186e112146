"""Compose the all-in-one platform: ``create_app(settings, store, drivers)``,
``drivers`` naming each enabled sandbox class's driver (``{"container": ...}``).

This is the wiring above the planes (:mod:`podbay.serve`): it builds the
node (drivers, warm pools, the gateway's route table and activity) as a
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
from podbay.console import admin
from podbay.console.guard import Guard
from podbay.console.latest import LatestSamples
from podbay.console.layer import ConsoleLayer
from podbay.console.proxy import LocalDataPlane
from podbay.console.tokens import Generation
from podbay.control.bodies import BodyLimit
from podbay.control.keys import KeyRing, StoreKeyRing
from podbay.control.logs import RequestIdMiddleware
from podbay.control.nodes import OneNode
from podbay.control.routes import health, observe, openapi, sandboxes, volumes
from podbay.control.services.assembly import build_control_services
from podbay.control.services.deletions import DeletionWatch, marker_path
from podbay.control.services.deployments import PUBLIC_URL_KEY, SectionValidator
from podbay.control.services.locks import NameLocks
from podbay.dataplane import http_errors
from podbay.dataplane.activity import ActivityTracker
from podbay.dataplane.classes import ClassCheck, ClassProof
from podbay.dataplane.credentials import Credential, CredentialVerifier, mint_credential
from podbay.dataplane.environment_seam import EnvironmentService, PlainEnvironment, Prepared
from podbay.dataplane.metrics import Metrics
from podbay.e2b.app import E2BApps
from podbay.errors import ApiError
from podbay.gateway.app import PREFIX as GATEWAY_PREFIX
from podbay.gateway.app import Gateway
from podbay.gateway.proxy import send_error
from podbay.node.local import host_node
from podbay.node.shutdown import release_machines, stop_tasks
from podbay.runtime.base import Driver
from podbay.settings import Settings
from podbay.store.base import Store
from podbay.wire.codes import ErrorCode
from podbay.wire.limits import MAX_CONTROL_BODY
from podbay.wire.paths import REQUEST_ID_HEADER, SHARE_PREFIX

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
        self._check = check
        self._prove = prove
        self.locks = NameLocks()
        self.environment = environment or PlainEnvironment()
        self.ready = False
        self.startup_error: str | None = None
        self._tasks: list[asyncio.Task[Any]] = []
        #: Checks of machines whose agent went quiet, by sandbox id.
        self._checking: dict[str, asyncio.Task[None]] = {}
        self.node = host_node(
            settings,
            drivers,
            name="local",
            base_url=self.base_url,
            environment=self.environment,
            missing=missing,
            activity=ActivityTracker(clock),
            on_pool_change=self._pool_changed,
        )
        #: ``missing``: why an enabled class has no driver (e.g. its module is absent).
        self.classes = self.node.classes
        self.activity = self.node.activity
        self.routes = self.node.routes
        #: Warm pools by class (``runtime.warm_pool``).
        self.pools = self.node.pools
        self.limits = self.node.limits
        self.nodes = OneNode(self.node, self.classes)
        ttl = settings.credentials.ttl_seconds
        services = build_control_services(
            settings,
            store,
            self.keys,
            nodes=self.nodes,
            locks=self.locks,
            metrics=self.metrics,
            mint=lambda sid, inc: self._mint(sid, inc, ttl),
            clock=clock,
            lifecycle=bool(self.classes.drivers),
            validate_section=validate_section,
            deleted_marker=marker_path(settings.data_dir),
            volumes=self.node.volumes,
        )
        self.volumes = services.volumes
        self.transitions, self.lifecycle = services.transitions, services.lifecycle
        self.deployments, self.sandboxes = services.deployments, services.sandboxes
        self.deletions = DeletionWatch(marker_path(settings.data_dir), store, self.nodes)
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
            websocket_idle_seconds=settings.server.port_websocket_idle_seconds,
            on_silent=functools.partial(self._suspect, silent=True),
        )
        self.control = Starlette(
            routes=[
                *health.routes,
                *openapi.routes,
                *sandboxes.routes,
                *volumes.routes,
                *observe.routes,
                *admin.routes,
            ],
            exception_handlers=http_errors.handlers,
            lifespan=self._lifespan,
        )
        self.control.state.platform = self
        # The web console (docs/console.md): its page, sign-in, stream, and its
        # cookie standing for a token on the API and this gateway's data plane.
        self.console_guard = Guard(self.keys, self.base_url, Generation(store), self.deployments)
        self._control = ConsoleLayer(
            RequestIdMiddleware(BodyLimit(self.control, MAX_CONTROL_BODY)),
            self.console_guard,
            self.sandboxes,
            LocalDataPlane(self.gateway),
            LatestSamples(self.sandboxes.nodes),
        )
        # E2B's SDKs (docs/e2b.md): its REST paths and requests naming an E2B sandbox.
        self.e2b = E2BApps(
            self.store,
            self.sandboxes,
            self.limits,
            settings.server.e2b_domain,
            local_gateway=(self.base_url, self.gateway),
        )

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
            # A WebSocket to a get_host(port) address is E2B's, whatever its path.
            chosen = self.e2b.route(scope) or (self.gateway if gateway else self._control)
            await chosen(scope, receive, send)
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
        self.e2b.service.start_sweeper()  # E2B's timeouts hold across restarts
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
        await self.node.sampler.close()
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
