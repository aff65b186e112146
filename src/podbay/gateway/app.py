"""The gateway: verify the credential, then relay to the sandbox's agent.

Addressing: a sandbox's ``endpoint`` is ``<public URL>/sandbox/<sandbox id>``;
the client appends data-plane paths (``/v1/exec``...) and the gateway strips
the prefix before relaying. Every check happens before a byte reaches the
agent::

    no / bad / expired credential            401 CREDENTIAL_INVALID
    credential for another sandbox           403 CREDENTIAL_WRONG_SANDBOX
    sandbox (that incarnation) not running   401 SANDBOX_NOT_RUNNING  → client re-attaches

Pure ASGI rather than a framework route: this is the hot path.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Awaitable, Callable

from podbay.asgi import Receive, Scope, Send
from podbay.errors import ApiError
from podbay.wire.codes import ErrorCode
from podbay.wire.limits import MAX_JSON_BODY
from podbay.wire.openapi import data_plane
from podbay.wire.paths import CREDENTIAL_HEADER, EXEC, FILES, REQUEST_ID_HEADER

from .activity import ActivityTracker
from .credentials import CredentialVerifier
from .proxy import relay, send_error
from .routes import RouteTable

PREFIX = "/sandbox/"
_CREDENTIAL = CREDENTIAL_HEADER.lower().encode()
_REQUEST_ID = REQUEST_ID_HEADER.lower().encode()
_EXEC = EXEC.encode()
_FILES = FILES.encode()
_OPENAPI = b"/openapi.json"
#: Data-plane paths without the sandbox prefix (see ``__call__``).
_BARE = b"/v1/"


async def _send_json(send: Send, document: object) -> None:
    body = json.dumps(document).encode()
    await send({"type": "http.response.start", "status": 200, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def endpoint_for(base_url: str, sandbox_id: str) -> str:
    return f"{base_url.rstrip('/')}{PREFIX}{sandbox_id}"


class Gateway:
    """ASGI app for every path under :data:`PREFIX` (and bare ``/v1/...``)."""

    def __init__(
        self,
        verifier: CredentialVerifier,
        routes: RouteTable,
        activity: ActivityTracker,
        *,
        observe: Callable[[str, int, float], None] | None = None,
        on_refusal: Callable[[str], None] | None = None,
        on_unreachable: Callable[[str], None] | None = None,
        before_route: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.verifier = verifier
        self.routes = routes
        self.activity = activity
        #: (kind, status, seconds) after each relayed request: metrics' hook.
        self.observe = observe
        #: (code) for every refusal: metrics' hook.
        self.on_refusal = on_refusal
        #: (sandbox id) when its agent did not answer: the control plane checks
        #: whether the machine died, so the next attach can bring it back.
        self.on_unreachable = on_unreachable
        #: Awaited before the route is looked up: brings the route table up to
        #: date with deletions made by another process.
        self.before_route = before_route

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        started = time.perf_counter()
        raw_path: bytes = scope.get("raw_path") or scope["path"].encode()
        if raw_path.startswith(_BARE):
            # A client that resolved "/v1/..." against the endpoint (URL
            # semantics) lost the prefix: the credential alone names the sandbox.
            sandbox_id, tail = None, raw_path
        else:
            sandbox_id, slash, tail = raw_path[len(PREFIX):].partition(b"/")
            tail = slash + tail
        credential_token = None
        request_id = None
        for key, value in scope["headers"]:
            if key == _CREDENTIAL:
                credential_token = value.decode("latin-1")
            elif key == _REQUEST_ID:
                request_id = value.decode("latin-1")
        request_id = request_id or uuid.uuid4().hex
        if tail == _OPENAPI and scope["method"] == "GET" and sandbox_id:
            # The contract is public: served without a credential.
            await _send_json(send, data_plane(PREFIX + sandbox_id.decode("latin-1")))
            return
        try:
            if not tail or sandbox_id == b"":
                raise ApiError(ErrorCode.ROUTE_NOT_FOUND, "no such data-plane path")
            credential = self.verifier.verify(credential_token)
            sid = credential.sandbox_id if sandbox_id is None else sandbox_id.decode("latin-1")
            if credential.sandbox_id != sid:
                raise ApiError(ErrorCode.CREDENTIAL_WRONG_SANDBOX,
                               "the credential is for another sandbox")
            if self.before_route is not None:
                await self.before_route()
            route = self.routes.get(sid)
            if route is None or route.incarnation != credential.incarnation:
                raise ApiError(ErrorCode.SANDBOX_NOT_RUNNING,
                               "the sandbox is not running; attach again")
        except ApiError as exc:
            await send_error(send, exc, request_id)
            if self.on_refusal is not None:
                self.on_refusal(exc.code.value)
            return
        query = scope.get("query_string") or b""
        target = tail + b"?" + query if query else tail
        self.activity.begin(sid)
        try:
            # Only a native file write streams an unbounded body; every other
            # body is JSON the agent reads whole.
            limit = None if scope["method"] == "PUT" and tail == _FILES else MAX_JSON_BODY
            status = await relay(route.pool, scope, receive, send, target, request_id, limit)
        finally:
            self.activity.end(sid)
        if status == 502 and self.on_unreachable is not None:
            self.on_unreachable(sid)
        self._observe("exec" if tail == _EXEC else "other", status, started)

    def _observe(self, kind: str, status: int, started: float) -> None:
        if self.observe is not None:
            self.observe(kind, status, time.perf_counter() - started)
