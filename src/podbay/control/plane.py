"""``podbay control``: the control plane alone, one of any number of replicas.

The wiring for split roles: the same services as ``serve``'s
(:class:`~.services.sandboxes.SandboxService`, lifecycle, deployments) over
:class:`~.remote.ClusterNodes` instead of an in-process node; signing keys
from the store (:class:`~.keys.StoreKeyRing`); per-sandbox leases in the
store (:class:`LeaseLocks`) so that replicas take turns on one sandbox. It
serves the public control plane (``/api/v1``), ``/healthz`` (200 when the
store answers) and the nodes' side of the internal API: enrollment,
heartbeats, public keys. It never carries data-plane traffic: handles point
at the node that holds the sandbox.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from datetime import UTC, datetime
from typing import Any

import psycopg
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from podbay.asgi import ASGIApp, Receive, Scope, Send
from podbay.dataplane import http_errors, nodeapi
from podbay.dataplane.credentials import mint_credential
from podbay.dataplane.metrics import Metrics
from podbay.domain import Deployment
from podbay.domain.node import NodeRecord
from podbay.errors import ApiError
from podbay.settings import Settings
from podbay.store.postgres import PostgresStore
from podbay.wire import codec
from podbay.wire.codes import ErrorCode
from podbay.wire.limits import MAX_CONTROL_BODY

from .bodies import BodyLimit
from .keys import StoreKeyRing
from .logs import RequestIdMiddleware
from .remote import ClusterNodes, node_keys_doc
from .routes import observe, openapi, sandboxes, volumes
from .routes.health import metrics as metrics_route
from .services.assembly import build_control_services
from .services.deletions import withdraw_deleted
from .services.deployments import PUBLIC_URL_KEY, SectionValidator
from .services.locks import NameLocks

log = logging.getLogger("podbay.control")
#: A sandbox's lease lasts this long unless renewed (its holder renews it at a
#: third): how long a sandbox waits when the replica driving it dies mid-way.
LEASE_SECONDS = 10.0
#: Largest body of a node's call (a heartbeat with every sandbox's activity).
MAX_HEARTBEAT_BODY = 8 * 1024 * 1024
#: Most sandboxes one suspects call names (a node sends one at a time).
MAX_SUSPECTS = 100


def _utcnow() -> datetime:
    return datetime.now(UTC)


class LeaseLocks(NameLocks):
    """Per-sandbox locks that hold across replicas: in this process an asyncio
    lock (no replica races itself), then a lease row in the store, renewed
    while held. Whoever holds it drives that sandbox's transitions."""

    def __init__(self, store: PostgresStore, clock: Callable[[], datetime]) -> None:
        super().__init__()
        self.store = store
        self.clock = clock
        self.holder = f"control-{uuid.uuid4().hex[:12]}"

    @contextlib.asynccontextmanager
    async def hold(self, deployment_id: str, name: str) -> AsyncIterator[None]:
        key = f"sandbox:{deployment_id}:{name}"
        async with super().hold(deployment_id, name):
            delay = 0.02
            while not await self.store.take_lease(key, self.holder, LEASE_SECONDS, self.clock()):
                await asyncio.sleep(delay)
                delay = min(delay * 2, 0.5)
            renew = asyncio.get_running_loop().create_task(self._renew(key))
            try:
                yield
            finally:
                renew.cancel()
                await asyncio.gather(renew, return_exceptions=True)
                # The store out of reach: the lease lapses on its own.
                with contextlib.suppress(psycopg.Error, OSError):
                    await self.store.drop_lease(key, self.holder)

    def stamp(self, deployment_id: str, name: str) -> int | None:
        # Other replicas drive transitions under their leases, not this
        # process's locks: a row read without the lease is never as good as one
        # read under it.
        return None

    async def _renew(self, key: str) -> None:
        while True:
            await asyncio.sleep(LEASE_SECONDS / 3)
            # A renewal the store missed is retried at the next third of the lease.
            with contextlib.suppress(psycopg.Error, OSError):
                await self.store.take_lease(key, self.holder, LEASE_SECONDS, self.clock())


class ControlPlane:
    """Everything one ``podbay control`` replica holds, and its ASGI entry point."""

    def __init__(
        self,
        settings: Settings,
        store: PostgresStore,
        keys: StoreKeyRing,
        *,
        validate_section: SectionValidator | None = None,
        clock: Callable[[], datetime] = _utcnow,
        extra_routes: Sequence[BaseRoute] = (),
    ) -> None:
        """``extra_routes``: what the composition root serves beside the control
        API (the operator's API); :meth:`wrap` puts a layer (the console) in front."""
        self.settings = settings
        self.store = store
        self.keys = keys
        self.clock = clock
        self.base_url = settings.server.base_url()
        #: The console's guard, when the composition root serves the console: the
        #: operator's API checks its tokens with it.
        self.console_guard: object | None = None
        #: What the composition root's surfaces (E2B's API) run with the plane.
        self.on_start: list[Callable[[], object]] = []
        self.on_close: list[Callable[[], Awaitable[None]]] = []
        self.metrics = Metrics()
        self.nodes = ClusterNodes(
            store, keys, lost_after=settings.cluster.node_lost_seconds, clock=clock
        )
        self.locks = LeaseLocks(store, clock)
        ttl = settings.credentials.ttl_seconds
        services = build_control_services(
            settings,
            store,
            keys,
            nodes=self.nodes,
            locks=self.locks,
            metrics=self.metrics,
            mint=lambda sid, inc: mint_credential(
                self.keys, sandbox_id=sid, incarnation=inc, ttl_seconds=ttl
            ),
            clock=clock,
            validate_section=validate_section,
            after_delete=self._withdraw_deleted,
        )
        assert services.transitions is not None
        assert services.lifecycle is not None
        self.transitions, self.lifecycle = services.transitions, services.lifecycle
        self.deployments, self.sandboxes = services.deployments, services.sandboxes
        self.volumes = services.volumes
        self.sandboxes.ready = True
        self._tasks: list[asyncio.Task[Any]] = []
        self._reconciling: set[str] = set()
        self.control = Starlette(
            routes=[
                Route("/healthz", self._healthz, methods=["GET"]),
                Route("/metrics", metrics_route, methods=["GET"]),
                Route(nodeapi.ENROLL, self._enroll, methods=["POST"]),
                Route(nodeapi.HEARTBEAT, self._heartbeat, methods=["POST"]),
                Route(nodeapi.KEYS, self._keys, methods=["GET"]),
                Route(nodeapi.SUSPECTS, self._suspects, methods=["POST"]),
                *openapi.routes,
                *sandboxes.routes,
                *volumes.routes,
                *observe.routes,
                *extra_routes,
            ],
            exception_handlers=http_errors.handlers,
            lifespan=self._lifespan,
        )
        self.control.state.platform = self
        self._app: ASGIApp = RequestIdMiddleware(BodyLimit(self.control, MAX_CONTROL_BODY))
        # A heartbeat of a busy node lists thousands of sandboxes' activity.
        self._internal = RequestIdMiddleware(BodyLimit(self.control, MAX_HEARTBEAT_BODY))

    def wrap(self, layer: Callable[[ASGIApp], ASGIApp]) -> None:
        """Put ``layer`` in front of the public API (never of the nodes' calls)."""
        self._app = layer(self._app)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        internal_call = scope.get("path", "").startswith(nodeapi.PREFIX)
        await (self._internal if internal_call else self._app)(scope, receive, send)

    async def _withdraw_deleted(self, deployment: Deployment) -> None:
        """A deployment deleted through the operator's API: its sandboxes are
        refused on their nodes now, as ``podbay deployment delete`` does, not at
        the next lifecycle pass."""
        missed = await withdraw_deleted(self.store, self.nodes, deployment.id)
        if missed:
            log.warning("nodes %s kept routes of deleted deployment %s", missed, deployment.name)

    # -- health --------------------------------------------------------------------------
    async def _healthz(self, request: Request) -> Response:
        try:
            await asyncio.wait_for(self.store.get_meta(PUBLIC_URL_KEY), 5.0)
        except (psycopg.Error, OSError, TimeoutError) as exc:
            return JSONResponse({"ready": False, "error": f"store: {exc}"}, status_code=503)
        await self.nodes.refresh()
        now = self.clock()
        nodes = {
            r.name: r.state(now, self.settings.cluster.node_lost_seconds)
            for r in self.nodes.records()
        }
        return JSONResponse({"ready": True, "nodes": nodes})

    # -- the nodes' calls ----------------------------------------------------------------
    async def _json(self, request: Request) -> dict[str, Any]:
        try:
            return codec.parse_object(await request.body())
        except codec.WireError as exc:
            raise ApiError(ErrorCode.REQUEST_INVALID, str(exc)) from None

    async def _node(self, request: Request) -> NodeRecord:
        credential = nodeapi.bearer(request.headers.get("authorization"))
        if not credential.startswith(nodeapi.NODE_CREDENTIAL_PREFIX):
            raise nodeapi.refused("not a node credential")
        record = await self.store.node_by_credential(nodeapi.credential_hash(credential))
        if record is None:
            raise nodeapi.refused("unknown node credential; enroll again")
        return record

    async def authenticate_node(self, request: Request) -> NodeRecord:
        """The enrolled node a node call comes from (a surface's own node calls)."""
        return await self._node(request)

    async def read_json(self, request: Request) -> Any:
        return await self._json(request)

    async def _enroll(self, request: Request) -> Response:
        doc = await self._json(request)
        if not nodeapi.enrollment_matches(
            str(doc.get("token", "")), self.settings.cluster.enrollment_token
        ):
            raise nodeapi.refused("the enrollment token is not valid")
        name, url, report = doc.get("name"), doc.get("url"), doc.get("report", {})
        if not isinstance(name, str) or not name or len(name) > 200:
            raise ApiError(ErrorCode.REQUEST_INVALID, "name must be a non-empty string")
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ApiError(ErrorCode.REQUEST_INVALID, "url must be an http(s) URL")
        if not isinstance(report, dict):
            raise ApiError(ErrorCode.REQUEST_INVALID, "report must be an object")
        credential = nodeapi.new_node_credential()
        if not await self.store.enroll_node(
            name, url, nodeapi.credential_hash(credential), report, self.clock()
        ):
            log.warning("enrollment as %s (at %s) refused: that node is enrolled", name, url)
            raise ApiError(
                ErrorCode.NODE_NAME_TAKEN,
                f"a node named {name!r} is enrolled; a node keeps its name until an"
                f" operator forgets it (podbay node forget {name})",
            )
        log.info("node %s enrolled at %s", name, url)
        await self.nodes.refresh(force=True)
        self._reconcile_later(name)
        return JSONResponse({"credential": credential, "name": name})

    async def _heartbeat(self, request: Request) -> Response:
        record = await self._node(request)
        doc = await self._json(request)
        report = doc.get("report")
        if not isinstance(report, dict):
            raise ApiError(ErrorCode.REQUEST_INVALID, "report must be an object")
        before = await self.store.heartbeat_node(record.name, report, self.clock())
        activity = doc.get("activity") or {}
        if isinstance(activity, dict):
            seen = {
                str(sid): datetime.fromtimestamp(float(when), UTC)
                for sid, when in activity.items()
                if isinstance(when, int | float)
            }
            if seen:
                await self.store.record_activity(seen)
        for sid in doc.get("unreachable") or []:
            if isinstance(sid, str):
                self._check_later(sid)
        # The node restarted (it reports its new boot before serving, not yet
        # ready), or it is ready now: make rows and machines agree.
        restarted = before is not None and before.report.get("boot") != report.get("boot")
        came_up = before is not None and report.get("ready") and not before.report.get("ready")
        if restarted or came_up:
            await self.nodes.refresh(force=True)
            self._reconcile_later(record.name)
        # The kids in use, so a node fetches a rotated key before a token needs it.
        return JSONResponse({"ok": True, "kids": self.keys.kids()})

    async def _suspects(self, request: Request) -> Response:
        """A node's gateway could not reach these sandboxes' agents: check their
        machines now, before the node answers its client's 502, so the attach
        that follows finds a dead machine already stopped (and carries it over)
        instead of its route, as under ``serve``. The heartbeat repeats what
        this call did not settle."""
        await self._node(request)
        doc = await self._json(request)
        ids = doc.get("sandboxes")
        if not isinstance(ids, list) or len(ids) > MAX_SUSPECTS:
            raise ApiError(
                ErrorCode.REQUEST_INVALID, f"sandboxes must be a list of at most {MAX_SUSPECTS}"
            )
        listed = doc.get("silent")
        silent = {s for s in listed if isinstance(s, str)} if isinstance(listed, list) else set()
        for sid in ids:
            if isinstance(sid, str):
                await self.lifecycle.check(sid, silent=sid in silent)
        return Response(status_code=204)

    async def _keys(self, request: Request) -> Response:
        await self._node(request)
        # Always from the store: a node asks when a token names a kid it lacks,
        # which another replica may have started signing with a moment ago.
        await self.keys.refresh()
        return JSONResponse(node_keys_doc(self.keys))

    # -- background ----------------------------------------------------------------------
    def _background(self, work: Any) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.append(task)
        task.add_done_callback(lambda t: self._tasks.remove(t) if t in self._tasks else None)

    def _reconcile_later(self, name: str) -> None:
        if name in self._reconciling:
            return
        self._reconciling.add(name)

        async def run() -> None:
            try:
                # The node enrolls, then fetches our keys, then proves classes:
                # retry until it takes our calls and reports ready.
                for attempt in range(30):
                    await self.nodes.refresh(force=True)
                    node = self.nodes.get(name)
                    if node is None:
                        return
                    if node.record.report.get("ready"):
                        try:
                            observed = await node.adopt()
                        except ApiError:
                            if attempt == 29:
                                raise
                        else:
                            await self.lifecycle.reconcile(node, observed, destroy_pooled=False)
                            return
                    await asyncio.sleep(1.0)
            except Exception:
                log.exception("reconciling node %s failed; its next restart retries", name)
            finally:
                self._reconciling.discard(name)

        self._background(run())

    def _check_later(self, sandbox_id: str) -> None:
        async def run() -> None:
            # Broad: a background task nobody awaits, so whatever the check
            # raised is logged here or lost.
            try:
                await self.lifecycle.check(sandbox_id)
            except Exception:
                log.exception("checking sandbox %s failed", sandbox_id)

        self._background(run())

    @contextlib.asynccontextmanager
    async def _lifespan(self, app: Starlette) -> AsyncIterator[None]:
        await self.store.set_meta(PUBLIC_URL_KEY, self.base_url)
        await self.nodes.refresh(force=True)
        self._tasks.append(asyncio.create_task(self.lifecycle.loop(self.keys.reload)))
        for start in self.on_start:
            start()
        try:
            yield
        finally:
            for close in self.on_close:
                await close()
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            # Broad: shutting down goes on (the nodes close next) whatever the
            # last write of activity met; the next heartbeats report it again.
            try:
                await self.lifecycle.flush_activity()
            except Exception:
                log.exception("writing the last activity failed")
            await self.nodes.close()
