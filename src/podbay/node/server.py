"""``podbay node``: one sandbox host of a cluster.

One ASGI app on one port: the public data plane (the gateway, ``/sandbox/<id>/...``
and share links, exactly as ``serve``'s) and the internal API the control
plane drives it through (``/internal/v1/...``, :mod:`podbay.node.control_calls`).
At start it proves its classes (like ``serve``), fills the default class's
warm pool, enrolls with the control plane (``cluster.enrollment_token`` →
a node credential kept in ``<data_dir>/node-credential``, 0600) and then
heartbeats every ``cluster.heartbeat_seconds``: classes, capacity, warm
machines, activity since the last beat and requests in flight.

Data-plane credentials are checked here with the control plane's public
keys (:class:`ControlKeys`), fetched with the node credential and fetched
again when a token names a key not seen yet (rotation).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import os
import secrets
import socket
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import httpx
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from podbay.asgi import ASGIApp, Receive, Scope, Send
from podbay.dataplane import http_errors, nodeapi
from podbay.dataplane.activity import ActivityTracker
from podbay.dataplane.classes import ClassCheck, ClassProof
from podbay.dataplane.credentials import CredentialVerifier
from podbay.dataplane.environment_seam import EnvironmentService, PlainEnvironment, Prepared
from podbay.dataplane.metrics import CONTENT_TYPE, Metrics
from podbay.dataplane.nodeapi import POOL_LABEL
from podbay.dataplane.routes import RouteTable
from podbay.runtime.base import Driver
from podbay.settings import Settings
from podbay.wire.codec import format_time

from .control_calls import routes as internal_routes
from .local import host_node
from .shutdown import release_machines, stop_tasks

log = logging.getLogger("podbay.node")

#: What a call to the control plane meets when it is out of reach or refuses
#: (its refusals are RuntimeErrors; a timeout is an OSError): a warning, no trace.
REACH_ERRORS = (httpx.HTTPError, RuntimeError, ValueError, OSError)
CREDENTIAL_FILE = "node-credential"
#: How long a start waits for the control plane to hear of it before serving.
ANNOUNCE_WAIT = 15.0
#: How long a client's 502 waits for the control plane to check the machine
#: whose agent was silent (a dead one is then carried over by the next attach).
SUSPECT_WAIT = 10.0
#: Paths the node answers itself; everything else outside /internal is the gateway's.
_OWN = ("/healthz", "/metrics")


class GatewayFactory(Protocol):
    """Builds the data plane this node serves (:class:`podbay.gateway.app.Gateway`,
    handed in by :mod:`podbay.serve`: the node and the gateway are peers)."""

    def __call__(
        self,
        verifier: CredentialVerifier,
        routes: RouteTable,
        activity: ActivityTracker,
        *,
        observe: Callable[[str, int, float], None] | None = None,
        on_refusal: Callable[[str], None] | None = None,
        on_unreachable: Callable[[str], Awaitable[None]] | None = None,
        default_user: str | None = None,
        answer_seconds: float | None = None,
        on_silent: Callable[[str], Awaitable[None]] | None = None,
        websocket_idle_seconds: float = ...,
    ) -> ASGIApp: ...


class Surface(Protocol):
    """Another API this node serves before its gateway (E2B's sandbox API,
    handed in by :mod:`podbay.serve`)."""

    def route(self, scope: Scope) -> ASGIApp | None: ...

    async def close(self) -> None: ...


#: Builds a node's surfaces once the node exists (they call its control plane
#: with its credential).
SurfaceFactory = Callable[["NodeServer"], Surface]


class ControlKeys:
    """The control plane's public keys, as a node verifies tokens with them.

    Fetched with the node credential; a kid not seen yet makes it fetch again
    (a rotation), at most once a second, so a forged kid costs no more."""

    REFETCH_INTERVAL = 1.0

    def __init__(self, control_url: str, credential: str) -> None:
        self.url = control_url.rstrip("/") + nodeapi.KEYS
        self.credential = credential
        self._keys: dict[str, Ed25519PublicKey] = {}
        self._fetched_at = 0.0

    def public_key(self, kid: str) -> Ed25519PublicKey | None:
        key = self._keys.get(kid)
        stale = time.monotonic() - self._fetched_at >= self.REFETCH_INTERVAL
        if key is None and (stale or not self._keys):
            # A key that cannot be fetched is an unknown key: the credential is
            # refused, never a failure of the gateway that asked. The answer is
            # input (any JSON): a malformed one is a LookupError, TypeError…
            try:
                self._apply(self._get_sync())
            except (httpx.HTTPError, ValueError, LookupError, TypeError, AttributeError) as exc:
                log.warning("fetching the control plane's keys failed: %r", exc)
            except Exception:  # broad, as said above: logged with its trace
                log.exception("fetching the control plane's keys failed")
            key = self._keys.get(kid)
        return key

    def kids(self) -> set[str]:
        return set(self._keys)

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.credential}"}

    # A fetch counts against the once-a-second bound when it has ended, not
    # when it began: a token naming a new kid that arrives while a heartbeat's
    # fetch is still under way must not find the keys "just fetched" (that
    # fetch may have left the control plane before the kid existed), or the
    # node refuses the first credentials signed with a rotated key.
    def _get_sync(self) -> Any:
        try:
            r = httpx.get(self.url, headers=self._headers(), timeout=3.0)
        finally:
            self._fetched_at = time.monotonic()
        r.raise_for_status()
        return r.json()

    async def fetch(self, client: httpx.AsyncClient) -> None:
        try:
            r = await client.get(self.url, headers=self._headers())
        finally:
            self._fetched_at = time.monotonic()
        r.raise_for_status()
        self._apply(r.json())

    def _apply(self, doc: Any) -> None:
        keys = {}
        for entry in doc.get("keys", []):
            keys[str(entry["kid"])] = nodeapi.public_key_from_text(str(entry["public"]))
        self._keys = keys


def capacity(settings: Settings) -> int:
    """How many sandboxes this node holds at most (``node.max_sandboxes``, else
    as many as its memory holds at ``runtime.memory_bytes`` each)."""
    if settings.node.max_sandboxes > 0:
        return settings.node.max_sandboxes
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 1
    return max(1, total // max(1, settings.runtime.memory_bytes))


class NodeServer:
    """Everything one ``podbay node`` holds, and its ASGI entry point."""

    def __init__(
        self,
        settings: Settings,
        drivers: Mapping[str, Driver],
        *,
        gateway: GatewayFactory,
        surfaces: Sequence[SurfaceFactory] = (),
        environment: EnvironmentService | None = None,
        check: ClassCheck | None = None,
        prove: ClassProof | None = None,
        missing: Mapping[str, str] | None = None,
    ) -> None:
        self.settings = settings
        self.name = settings.node.name or socket.gethostname()
        self.url = (
            settings.node.advertise_url or f"http://{settings.server.host}:{settings.server.port}"
        ).rstrip("/")
        if not settings.node.control_url:
            raise ValueError("node.control_url (PODBAY_NODE_CONTROL_URL) is required")
        self.control_url = settings.node.control_url.rstrip("/")
        self.metrics = Metrics()
        self._check = check
        self._prove = prove
        self.node = host_node(
            settings,
            drivers,
            name=self.name,
            base_url=self.url,
            environment=environment or PlainEnvironment(),
            missing=missing,
        )
        self.classes = self.node.classes
        self.pools = self.node.pools
        self.routes = self.node.routes
        self.activity = self.node.activity
        #: Environments this node prepared, by key: the control plane names them by key.
        self.prepared: dict[str, Prepared] = {"": Prepared()}
        self.credential = self._read_credential()
        self.keys = ControlKeys(self.control_url, self.credential or "")
        self.verifier = CredentialVerifier(self.keys)
        #: Sandboxes whose agent went silent, for the next heartbeat to report
        #: (when reporting them at once failed).
        self._unreachable: set[str] = set()
        #: Reports under way, by sandbox: concurrent 502s of one sandbox share one.
        self._suspects: dict[str, asyncio.Task[None]] = {}
        # Wired as serve/platform.py's Platform wires it, on purpose: the same
        # gateway with each process's own hooks (metrics, unreachable agents).
        self.gateway = gateway(
            self.verifier,
            self.routes,
            self.activity,
            observe=self.metrics.observe_gateway,
            on_refusal=self.metrics.refused,
            on_unreachable=self._suspect,
            default_user=settings.runtime.default_user or None,
            answer_seconds=settings.server.agent_answer_seconds,
            websocket_idle_seconds=settings.server.port_websocket_idle_seconds,
            on_silent=functools.partial(self._suspect, silent=True),
        )
        self.boot = secrets.token_hex(8)
        self.ready = False
        self.enrolled = False
        self.startup_error: str | None = None
        self._tasks: list[asyncio.Task[Any]] = []
        self._wake = asyncio.Event()
        self.client = httpx.AsyncClient(timeout=10.0)
        self.internal = Starlette(
            routes=[
                Route("/healthz", self._healthz, methods=["GET"]),
                Route("/metrics", self._metrics, methods=["GET"]),
                *internal_routes,
            ],
            exception_handlers=http_errors.handlers,
            lifespan=self._lifespan,
        )
        self.internal.state.node = self
        self.surfaces = [make(self) for make in surfaces]

    # -- credential --------------------------------------------------------------------
    @property
    def _credential_path(self) -> Path:
        return self.settings.data_dir / CREDENTIAL_FILE

    def _read_credential(self) -> str | None:
        try:
            return self._credential_path.read_text().strip() or None
        except OSError:
            return None

    def _write_credential(self, credential: str) -> None:
        path = self._credential_path
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(credential + "\n")
        os.replace(tmp, path)

    # -- ASGI ----------------------------------------------------------------------------
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path: str = scope.get("path", "")
        if scope["type"] == "lifespan" or path.startswith(nodeapi.PREFIX) or path in _OWN:
            await self.internal(scope, receive, send)
            return
        for surface in self.surfaces:
            app = surface.route(scope)
            if app is not None:
                await app(scope, receive, send)
                return
        await self.gateway(scope, receive, send)

    async def _healthz(self, request: Request) -> Response:
        ok = self.ready and self.enrolled
        body = {
            "ready": ok,
            "node": self.name,
            "enrolled": self.enrolled,
            "classes": self.classes.describe(),
            "error": self.startup_error,
        }
        return JSONResponse(body, status_code=200 if ok else 503)

    async def _metrics(self, request: Request) -> Response:
        """The gateway's figures (requests, refusals) and how many sandboxes run here."""
        body = self.metrics.render({"running": len(self.routes)})
        return Response(body, media_type=CONTENT_TYPE)

    # -- reports -------------------------------------------------------------------------
    def report(self) -> dict[str, Any]:
        return {
            "ready": self.ready,
            "classes": list(self.classes.available),
            "default": self.classes.default,
            "capacity": capacity(self.settings),
            "running": len(self.routes),
            "warm": {name: len(pool) for name, pool in self.pools.items()},
            # Classes whose stopped machines can move to or from here.
            "movable": [
                name
                for name in self.classes.available
                if self.classes.driver(name).capabilities.move
            ],
            "busy": sorted(self.activity.busy_ids()),
            "boot": self.boot,
            # OOM kills per sandbox (running totals): the control plane's events.
            "oom": {
                sid: [format_time(at), n] for sid, (at, n) in self.node.sampler.oom_kills().items()
            },
        }

    async def enroll(self) -> None:
        body = {
            "name": self.name,
            "url": self.url,
            "token": self.settings.cluster.enrollment_token,
            "report": self.report(),
        }
        r = await self.client.post(self.control_url + nodeapi.ENROLL, json=body)
        if r.status_code != 200:
            raise RuntimeError(f"enrollment refused ({r.status_code}): {r.text[:300]}")
        credential = str(r.json()["credential"])
        self._write_credential(credential)
        self.credential = self.keys.credential = credential
        await self.keys.fetch(self.client)
        self.enrolled = True
        log.info("enrolled with %s as %s", self.control_url, self.name)

    async def heartbeat(self) -> None:
        seen = self.activity.drain()
        body = {
            "report": self.report(),
            "activity": {sid: when.timestamp() for sid, when in seen.items()},
            "unreachable": sorted(self._unreachable),
        }
        try:
            r = await self.client.post(
                self.control_url + nodeapi.HEARTBEAT,
                content=json.dumps(body),
                headers={
                    "Authorization": f"Bearer {self.credential}",
                    "Content-Type": "application/json",
                },
            )
        except Exception:
            self.activity.restore(seen)
            raise
        if r.status_code == 401:  # forgotten, or the credential was replaced: enroll again
            self.activity.restore(seen)
            self.enrolled = False
            await self.enroll()
            return
        if r.status_code != 200:
            self.activity.restore(seen)
            raise RuntimeError(f"heartbeat refused ({r.status_code}): {r.text[:300]}")
        self._unreachable.clear()
        kids = r.json().get("kids")
        if isinstance(kids, list) and set(kids) != self.keys.kids():
            await self.keys.fetch(self.client)

    async def _suspect(self, sandbox_id: str, *, silent: bool = False) -> None:
        """The gateway could not reach a sandbox's agent: report it to the
        control plane at once, before the client hears its 502, so the attach
        that follows finds the machine checked (carried over if it died), not
        its route. Waits ``SUSPECT_WAIT`` at most; the heartbeat reports what
        this did not. ``silent``: the agent did not answer a new connection
        either (see :meth:`Lifecycle.check`)."""
        self._unreachable.add(sandbox_id)
        task = self._suspects.get(sandbox_id)
        if task is None:
            report = self._report_suspect(sandbox_id, silent)
            task = asyncio.get_running_loop().create_task(report)
            self._suspects[sandbox_id] = task
            task.add_done_callback(functools.partial(self._reported, sandbox_id))
        try:
            await asyncio.wait_for(asyncio.shield(task), SUSPECT_WAIT)
        except REACH_ERRORS as exc:
            log.warning("sandbox %s: reporting its silent agent failed: %s", sandbox_id, exc)
        except Exception:  # broad: the gateway's 502 or 504 goes out whatever the report met
            log.exception("sandbox %s: reporting its silent agent failed", sandbox_id)

    async def _report_suspect(self, sandbox_id: str, silent: bool) -> None:
        r = await self.client.post(
            self.control_url + nodeapi.SUSPECTS,
            json={"sandboxes": [sandbox_id], "silent": [sandbox_id] if silent else []},
            headers={"Authorization": f"Bearer {self.credential}"},
        )
        r.raise_for_status()
        self._unreachable.discard(sandbox_id)

    def _reported(self, sandbox_id: str, task: asyncio.Task[None]) -> None:
        if self._suspects.get(sandbox_id) is task:
            del self._suspects[sandbox_id]

    async def _join(self) -> None:
        """Enroll, or prove the kept credential with a heartbeat (a 401 enrolls
        again); healthy only once the control plane's keys are here too."""
        if self.credential:
            await self.heartbeat()
            await self.keys.fetch(self.client)
            self.enrolled = True
        else:
            await self.enroll()

    async def _beat_forever(self) -> None:
        while True:
            try:
                if not self.enrolled:
                    await self._join()
                await self.heartbeat()
            except asyncio.CancelledError:
                raise
            except REACH_ERRORS as exc:
                log.warning("control plane unreachable: %s", exc)
            # Broad: the heartbeat loop outlives any one failure (the node is
            # reported lost if it stops); the next beat tries again.
            except Exception:
                log.exception("heartbeat failed")
            # A beat every interval, or at once when woken (the node became ready).
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.settings.cluster.heartbeat_seconds)
            self._wake.clear()

    # -- start and stop ------------------------------------------------------------------
    @contextlib.asynccontextmanager
    async def _lifespan(self, app: Starlette) -> AsyncIterator[None]:
        await self._announce()
        # Beating from now on, ready or not: a long start (classes proved, the
        # pool filled) does not make the node look lost.
        self._tasks.append(asyncio.create_task(self._beat_forever()))
        self._tasks.append(asyncio.create_task(self._start()))
        try:
            yield
        finally:
            await self.shutdown()
            for surface in self.surfaces:
                await surface.close()

    async def _announce(self) -> None:
        """Report this process's boot before serving anything. The routes an
        earlier process took died with it; the store forgets them in the
        transaction that records the new boot, so no attach hands out a route
        this process does not hold (it publishes it again, once we are ready).
        The listening socket queues connections meanwhile. A control plane out
        of reach is waited for ``ANNOUNCE_WAIT`` at most (then the heartbeat
        loop keeps trying)."""
        try:
            await asyncio.wait_for(self._join(), ANNOUNCE_WAIT)
        except REACH_ERRORS as exc:
            log.warning("could not report this start to the control plane yet: %r", exc)
        # Broad: the node starts serving whatever the control plane answered;
        # the heartbeat loop reports the start again.
        except Exception:
            log.exception("could not report this start to the control plane yet")

    async def _start(self) -> None:
        try:
            await self.classes.start(self._check, self._prove)
        except Exception as exc:
            log.exception("the runtime could not start")
            self.startup_error = str(exc)
            return
        await self._clear_old_pool()
        default_pool = self.pools.get(self.classes.default or "")
        if default_pool is not None:
            default_pool.refill(Prepared(), delay=0.0)
            await default_pool.wait_filled()
        self.ready = True
        log.info("node %s ready (classes %s)", self.name, list(self.classes.available))
        self._wake.set()  # tell the control plane now: it reconciles us, then places here

    async def _clear_old_pool(self) -> None:
        """Pool machines of a previous run are nobody's: destroy them before
        filling (the control plane's reconcile leaves pool machines to us)."""
        for name, seen in (await self.node.adopt()).items():
            for machine in seen:
                if POOL_LABEL in machine.labels:
                    # Broad: one machine that cannot be destroyed does not keep
                    # the node from filling its pools; `podbay gc` finds it later.
                    try:
                        await self.classes.driver(name).destroy(machine.machine_id)
                    except Exception:
                        log.exception("could not destroy old pool machine %s", machine.machine_id)

    async def shutdown(self) -> None:
        await stop_tasks(self.classes, self._tasks)
        await self.node.sampler.close()
        await release_machines(self.classes, self.pools, self.routes, self.node.environment)
        await self.client.aclose()
