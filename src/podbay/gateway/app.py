"""The gateway: verify the credential, then relay to the sandbox's agent.

Addressing: a sandbox's ``endpoint`` is ``<public URL>/sandbox/<sandbox id>``;
the client appends data-plane paths (``/v1/exec``...) and the gateway strips
the prefix before relaying. Every check happens before a byte reaches the
agent::

    no / bad / expired credential            401 CREDENTIAL_INVALID
    credential for another sandbox           403 CREDENTIAL_WRONG_SANDBOX
    sandbox (that incarnation) not running   401 SANDBOX_NOT_RUNNING  → client re-attaches
    server restarted, its sandboxes being    held until they are (at most
      taken back                             ADOPTION_HOLD_SECONDS), else
                                             503 SANDBOXES_UNAVAILABLE + Retry-After

Pure ASGI rather than a framework route: this is the hot path.
"""

from __future__ import annotations

import contextlib
import functools
import json
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator

from podbay.asgi import Receive, Scope, Send, send_refusal
from podbay.dataplane.activity import ActivityTracker
from podbay.dataplane.credentials import CredentialVerifier, verify_share
from podbay.dataplane.routes import Route, RouteTable
from podbay.errors import ApiError
from podbay.wire.codes import ErrorCode
from podbay.wire.limits import MAX_JSON_BODY
from podbay.wire.openapi import data_plane
from podbay.wire.paths import (
    CREDENTIAL_HEADER,
    DEFAULT_USER_HEADER,
    EXEC,
    EXEC_STDIN_CONTENT_TYPE,
    FILES,
    PORTS,
    PROCESSES,
    PTY,
    REQUEST_ID_HEADER,
    SANDBOX_PREFIX,
    SHARE_PREFIX,
)

from . import ports, portsocket, terminal
from .proxy import relay, send_error

PREFIX = SANDBOX_PREFIX
_CREDENTIAL = CREDENTIAL_HEADER.lower().encode()
_REQUEST_ID = REQUEST_ID_HEADER.lower().encode()
_EXEC = EXEC.encode()
_FILES = FILES.encode()
_OPENAPI = b"/openapi.json"
_PTY = PTY.encode()
_PORTS = PORTS.encode() + b"/"
_SHARE = SHARE_PREFIX.encode()
_PROCESSES = PROCESSES.encode() + b"/"
_STDIN_TAIL = b"/stdin"
_EXEC_STDIN = EXEC_STDIN_CONTENT_TYPE.encode()
#: Data-plane paths without the sandbox prefix (see ``__call__``).
_BARE = b"/v1/"
#: How long a request whose sandbox has no route yet waits while a restarted
#: server takes back its machines, before 503 with ``Retry-After`` (seconds).
ADOPTION_HOLD_SECONDS = 10.0
ADOPTION_RETRY_SECONDS = 1.0
#: Longest the gateway asks a late agent whether it answers at all.
PROBE_SECONDS = 10.0
#: How long a server in the sandbox may take to answer a WebSocket upgrade.
#: uvicorn's WebSocket protocol drops a client whose handshake is not done in
#: 10 s (its ``open_timeout``, which it does not expose): the refusal must
#: reach the client before that, also through E2B's ``get_host`` leg.
WEBSOCKET_HANDSHAKE_SECONDS = 7.0
#: Default of ``server.port_websocket_idle_seconds``.
WEBSOCKET_IDLE_SECONDS = 600.0


async def _send_json(send: Send, document: object) -> None:
    body = json.dumps(document).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


class Gateway:
    """ASGI app for every path under :data:`PREFIX` (and bare ``/v1/...``)."""

    # Collaborators come in built (the composition root wires them), so a test
    # hands in fakes and no service builds another behind the caller's back.
    def __init__(
        self,
        verifier: CredentialVerifier,
        routes: RouteTable,
        activity: ActivityTracker,
        *,
        observe: Callable[[str, int, float], None] | None = None,
        on_refusal: Callable[[str], None] | None = None,
        on_unreachable: Callable[[str], Awaitable[None]] | None = None,
        before_route: Callable[[], Awaitable[None]] | None = None,
        default_user: str | None = None,
        answer_seconds: float | None = None,
        on_silent: Callable[[str], Awaitable[None]] | None = None,
        websocket_idle_seconds: float = WEBSOCKET_IDLE_SECONDS,
    ) -> None:
        self.verifier = verifier
        self.routes = routes
        self.activity = activity
        #: (kind, status, seconds) after each relayed request: metrics' hook.
        self.observe = observe
        #: (code) for every refusal: metrics' hook.
        self.on_refusal = on_refusal
        #: (sandbox id) when its agent did not answer, awaited before the client
        #: hears its 502: the control plane checks whether the machine died, so
        #: the next attach can bring it back.
        self.on_unreachable = on_unreachable
        #: Longest wait for an agent to start answering (see :mod:`.deadline`).
        self.answer_seconds = answer_seconds
        #: (sandbox id) when its agent missed that deadline and then did not
        #: answer a new connection either, awaited before the client hears its
        #: 504: the control plane stops the machine, so the next attach starts
        #: it again. When the agent does answer, ``on_unreachable`` is called.
        self.on_silent = on_silent
        #: A WebSocket to a port with no message either way this long is closed.
        self.websocket_idle_seconds = websocket_idle_seconds
        #: Awaited before the route is looked up: brings the route table up to
        #: date with deletions made by another process.
        self.before_route = before_route
        #: Told to the agent with every request: the operator's default account.
        self.extra_headers: list[tuple[bytes, bytes]] = (
            [(DEFAULT_USER_HEADER.lower().encode(), default_user.encode())] if default_user else []
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket":
            await self._websocket(scope, receive, send)
            return
        started = time.perf_counter()
        raw_path: bytes = scope.get("raw_path") or scope["path"].encode()
        request_id = _request_id(scope)
        if raw_path.startswith(_SHARE):
            await self._shared(scope, receive, send, raw_path, request_id)
            return
        sandbox_id, tail = _split(raw_path)
        if tail == _OPENAPI and scope["method"] == "GET" and sandbox_id:
            # The contract is public: served without a credential.
            await _send_json(send, data_plane(PREFIX + sandbox_id.decode("latin-1")))
            return
        try:
            sid, route = await self._authorize(scope, sandbox_id, tail)
        except ApiError as exc:
            await send_error(send, exc, request_id)
            return
        self.activity.begin(sid)
        try:
            if tail.startswith(_PORTS):
                status = await self._port(
                    route, scope, receive, send, tail, request_id, _prefix(raw_path, tail)
                )
            else:
                query = scope.get("query_string") or b""
                target = tail + b"?" + query if query else tail
                # Only a native file write streams an unbounded body; every other
                # body is JSON the agent reads whole.
                limit = None if _streams_body(scope, tail) else MAX_JSON_BODY
                hook = self.on_unreachable
                status = await relay(
                    route.pool,
                    scope,
                    receive,
                    send,
                    target,
                    request_id,
                    limit,
                    self.extra_headers,
                    None if hook is None else functools.partial(hook, sid),
                    route.admission,
                    self.answer_seconds,
                    functools.partial(self._late, sid, route),
                )
        finally:
            self.activity.end(sid)
        self._observe("exec" if tail == _EXEC else "other", status, started)

    async def _late(self, sandbox_id: str, route: Route) -> None:
        """The agent missed its deadline: ask it again on a new connection (bounded
        by the same deadline, at most :data:`PROBE_SECONDS`); silent there too, the
        machine is reported silent, else only checked as for a 502."""
        seconds = min(self.answer_seconds or PROBE_SECONDS, PROBE_SECONDS)
        hook = self.on_unreachable
        if not await route.pool.answers(seconds) and self.on_silent is not None:
            hook = self.on_silent
        if hook is not None:
            await hook(sandbox_id)

    async def _authorize(
        self, scope: Scope, sandbox_id: bytes | None, tail: bytes
    ) -> tuple[str, Route]:
        """The sandbox the credential reaches and its route; the refusal otherwise
        (counted for metrics)."""
        credential_token = None
        for key, value in scope["headers"]:
            if key == _CREDENTIAL:
                credential_token = value.decode("latin-1")
        with self._counted():
            if not tail or sandbox_id == b"":
                raise ApiError(ErrorCode.ROUTE_NOT_FOUND, "no such data-plane path")
            credential = self.verifier.verify(credential_token)
            sid = credential.sandbox_id if sandbox_id is None else sandbox_id.decode("latin-1")
            if credential.sandbox_id != sid:
                raise ApiError(
                    ErrorCode.CREDENTIAL_WRONG_SANDBOX, "the credential is for another sandbox"
                )
            gone = "the sandbox is not running; attach again"
            route = await self._live_route(sid, credential.incarnation, gone)
        return sid, route

    @contextlib.contextmanager
    def _counted(self) -> Iterator[None]:
        """A refusal raised inside is counted (metrics' hook) on its way out."""
        try:
            yield
        except ApiError as exc:
            if self.on_refusal is not None:
                self.on_refusal(exc.code.value)
            raise

    async def _live_route(self, sandbox_id: str, incarnation: int | None, gone: str) -> Route:
        """The sandbox's route (of ``incarnation`` when given); ``gone`` refuses
        with SANDBOX_NOT_RUNNING otherwise."""
        if self.before_route is not None:
            await self.before_route()
        route = self.routes.get(sandbox_id)
        if route is None and not self.routes.settled:
            # A restarted server is still taking back its machines: a credential
            # issued before the restart keeps working (docs/platform.md) once its
            # sandbox's route is back. Held a while, then a refusal to retry.
            if not await self.routes.wait_settled(ADOPTION_HOLD_SECONDS):
                raise ApiError(
                    ErrorCode.SANDBOXES_UNAVAILABLE,
                    "the server is taking back its sandboxes after a restart; retry",
                    retry_after=ADOPTION_RETRY_SECONDS,
                )
            route = self.routes.get(sandbox_id)
        if route is None or (incarnation is not None and route.incarnation != incarnation):
            raise ApiError(ErrorCode.SANDBOX_NOT_RUNNING, gone)
        return route

    async def _share_route(self, raw_path: bytes) -> tuple[str, Route, int, bytes, str]:
        """A share URL's sandbox, route, port, the path within and the prefix before it."""
        token, slash, rest = raw_path[len(_SHARE) :].partition(b"/")
        with self._counted():
            share = verify_share(self.verifier.keys, token.decode("latin-1"))
            gone = "the shared sandbox is not running right now"
            route = await self._live_route(share.sandbox_id, None, gone)
        return (
            share.sandbox_id,
            route,
            share.port,
            slash + rest if slash else b"/",
            _SHARE.decode() + token.decode("latin-1"),
        )

    async def _shared(
        self, scope: Scope, receive: Receive, send: Send, raw_path: bytes, request_id: str
    ) -> None:
        try:
            sid, route, port, path, prefix = await self._share_route(raw_path)
        except ApiError as exc:
            await send_error(send, exc, request_id)
            return
        self.activity.begin(sid)
        try:
            await self._port_admitted(route, port, path, prefix, scope, receive, send, request_id)
        finally:
            self.activity.end(sid)

    async def _port(
        self,
        route: Route,
        scope: Scope,
        receive: Receive,
        send: Send,
        tail: bytes,
        request_id: str,
        prefix: str,
    ) -> int:
        target = ports.parse_target(tail)
        if target is None:
            exc = ApiError(
                ErrorCode.ROUTE_NOT_FOUND,
                "a port path is /v1/ports/{port}/..., port from 1 to 65535",
            )
            await send_error(send, exc, request_id)
            return exc.status
        port, path = target
        return await self._port_admitted(
            route, port, path, prefix + f"{PORTS}/{port}", scope, receive, send, request_id
        )

    async def _port_admitted(
        self,
        route: Route,
        port: int,
        path: bytes,
        prefix: str,
        scope: Scope,
        receive: Receive,
        send: Send,
        request_id: str,
    ) -> int:
        """:func:`ports.relay_http` in one of the sandbox's slots (its body, if
        any, streams from the client: see :mod:`.admission`)."""
        streams = any(
            key == b"transfer-encoding" or (key == b"content-length" and value.strip() != b"0")
            for key, value in scope["headers"]
        )
        try:
            await route.admission.acquire(streams=streams)
        except ApiError as exc:
            await send_error(send, exc, request_id)
            return exc.status
        try:
            return await ports.relay_http(
                route.socket, port, path, prefix, scope, receive, send, request_id
            )
        finally:
            route.admission.release(streams=streams)

    async def _websocket(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Terminals and WebSocket ports: every check before the upgrade is accepted;
        a refusal is the contract's HTTP answer (where the server can send one)."""
        raw_path: bytes = scope.get("raw_path") or scope["path"].encode()
        try:
            if raw_path.startswith(_SHARE):
                sid, route, port, path, prefix = await self._share_route(raw_path)
            else:
                sandbox_id, tail = _split(raw_path)
                sid, route = await self._authorize(scope, sandbox_id, tail)
                target = ports.parse_target(tail) if tail.startswith(_PORTS) else None
                if tail == _PTY:
                    port, path, prefix = 0, b"", ""
                elif target is not None:
                    port, path = target
                    prefix = _prefix(raw_path, tail) + f"{PORTS}/{port}"
                else:
                    raise ApiError(
                        ErrorCode.ROUTE_NOT_FOUND,
                        f"no WebSocket at this path; use {PTY} or {PORTS}/{{port}}/",
                    )
        except ApiError as exc:
            await _deny(scope, send, exc)
            return
        self.activity.begin(sid)
        try:
            if port == 0:
                if await receive() == {"type": "websocket.connect"}:
                    await send({"type": "websocket.accept"})
                    await terminal.session(route.socket, receive, send, self.extra_headers)
            else:
                await self._port_websocket(route, port, path, prefix, scope, receive, send)
        finally:
            self.activity.end(sid)

    async def _port_websocket(
        self,
        route: Route,
        port: int,
        path: bytes,
        prefix: str,
        scope: Scope,
        receive: Receive,
        send: Send,
    ) -> None:
        """:func:`portsocket.relay` in one of the sandbox's WebSocket slots (see
        :mod:`podbay.dataplane.admission`): the same credential or share URL
        as HTTP to the port got it here; a WebSocket opens nothing more."""
        try:
            route.admission.open_websocket()
        except ApiError as exc:
            await _deny(scope, send, exc)
            return
        try:
            query = scope.get("query_string") or b""
            target = (path + b"?" + query if query else path).decode("latin-1")
            refusal = await portsocket.relay(
                route.socket,
                port,
                target,
                ports.websocket_headers(scope, prefix),
                scope,
                receive,
                send,
                handshake_seconds=WEBSOCKET_HANDSHAKE_SECONDS,
                idle_seconds=self.websocket_idle_seconds,
            )
            if refusal is not None:
                await _deny(scope, send, refusal)
        finally:
            route.admission.close_websocket()

    def _observe(self, kind: str, status: int, started: float) -> None:
        if self.observe is not None:
            self.observe(kind, status, time.perf_counter() - started)


def _request_id(scope: Scope) -> str:
    for key, value in scope["headers"]:
        if key == _REQUEST_ID:
            return str(value.decode("latin-1"))
    return uuid.uuid4().hex


def _split(raw_path: bytes) -> tuple[bytes | None, bytes]:
    """The sandbox id in the path (None for a bare ``/v1/...``) and the data-plane path."""
    if raw_path.startswith(_BARE):
        # A client that resolved "/v1/..." against the endpoint (URL
        # semantics) lost the prefix: the credential alone names the sandbox.
        return None, raw_path
    sandbox_id, slash, tail = raw_path[len(PREFIX) :].partition(b"/")
    return sandbox_id, slash + tail


def _prefix(raw_path: bytes, tail: bytes) -> str:
    """The path before the data-plane path (``/sandbox/<id>`` or empty)."""
    return raw_path[: len(raw_path) - len(tail)].decode("latin-1")


async def _deny(scope: Scope, send: Send, exc: ApiError) -> None:
    """Refuse a WebSocket before accepting it: the contract's JSON answer with its
    status where the server offers the denial extension, else a close."""
    if "websocket.http.response" in (scope.get("extensions") or {}):
        await send_refusal(send, exc, kind="websocket.http")
    else:
        await send({"type": "websocket.close", "code": 1008})


def _streams_body(scope: Scope, tail: bytes) -> bool:
    """Whether the body streams with no cap: a native file write, an exec's
    stdin or a process's stdin. Every other body is JSON the agent reads whole."""
    method = scope["method"]
    if method == "PUT":
        return tail == _FILES
    if method != "POST":
        return False
    if tail == _EXEC:
        return any(
            key == b"content-type" and value.split(b";")[0].strip().lower() == _EXEC_STDIN
            for key, value in scope["headers"]
        )
    return tail.startswith(_PROCESSES) and tail.endswith(_STDIN_TAIL)
