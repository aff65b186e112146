"""The console in front of the control plane: one ASGI layer that serves the
console's own paths and lets the console's cookie stand for a token.

- ``/`` and the console's own routes (:func:`.static.is_page`): the page; ``/console/assets/...``
- ``/console/session``, ``/console/stream``, ``/console/sandboxes/...``
- ``/api/v1/...`` with the session cookie and no ``Authorization``: the
  session's checks (:class:`~.guard.Guard`), then for the sandbox API an
  identity token of the deployment the session acts for, so the control
  plane's routes (and any added later) check the call as an SDK's; for the
  operator's API (:mod:`podbay.console.admin`) the session itself,
  in ``scope[SESSION_SCOPE_KEY]``.

A request with ``Authorization`` passes untouched: the token API is as before.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from podbay.asgi import ASGIApp, Receive, Scope, Send, send_refusal
from podbay.errors import ApiError
from podbay.wire.codes import ErrorCode
from podbay.wire.paths import SANDBOXES

from . import proxy, session, static, stream
from .guard import DEPLOYMENT_HEADER, Guard, cookie, header
from .latest import LatestSamples
from .tokens import Session

if TYPE_CHECKING:
    from podbay.control.services.sandboxes import SandboxService

#: Where the operator's API finds a console session (see the module's doc).
SESSION_SCOPE_KEY = "podbay.console_session"
API_PREFIX = "/api/v1/"
_DROPPED = {b"cookie", b"x-csrf-token", DEPLOYMENT_HEADER.encode()}


class ConsoleLayer:
    def __init__(
        self,
        app: ASGIApp,
        guard: Guard,
        sandboxes: SandboxService,
        data_plane: proxy.DataPlane,
        latest: LatestSamples,
    ) -> None:
        self.app = app
        self.guard = guard
        self.sandboxes = sandboxes
        #: Where the console's data-plane calls go: this process's gateway
        #: (``serve``) or the sandbox's node (a control replica).
        self.data_plane = data_plane
        #: The stream's ``metrics`` event: the nodes' newest samples.
        self.latest = latest

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        try:
            if path.startswith(proxy.PREFIX):
                await proxy.relay(self.guard, self.sandboxes, self.data_plane, scope, receive, send)
            elif scope["type"] == "websocket":
                await self.app(scope, receive, send)
            elif path.startswith(API_PREFIX):
                await self._api(scope, receive, send)
            elif path == "/console/session":
                await session.serve(self.guard, scope, receive, send)
            elif path == "/console/stream":
                await stream.serve(self.guard, self.sandboxes, self.latest, scope, receive, send)
            elif static.is_page(path) or path.startswith(static.ASSETS_PREFIX):
                if scope["method"] not in ("GET", "HEAD"):
                    raise ApiError(ErrorCode.METHOD_NOT_ALLOWED, "the console's files are read")
                if static.is_page(path):
                    await static.page(send)
                else:
                    await static.asset(scope, send)
            else:
                await self.app(scope, receive, send)
        except ApiError as exc:
            await self._refuse(scope, send, exc)

    async def _refuse(self, scope: Scope, send: Send, exc: ApiError) -> None:
        if scope["type"] == "websocket":
            # Refused before the upgrade: the contract's answer where the server
            # offers the denial extension, else a policy close.
            if "websocket.http.response" in (scope.get("extensions") or {}):
                await send_refusal(send, exc, *static.SECURITY_HEADERS, kind="websocket.http")
            else:
                await send({"type": "websocket.close", "code": 1008})
            return
        await send_refusal(send, exc, *static.SECURITY_HEADERS)

    async def _api(self, scope: Scope, receive: Receive, send: Send) -> None:
        if header(scope, "authorization") is not None or cookie(scope) is None:
            await self.app(scope, receive, send)
            return
        checked: Session = await self.guard.session(scope)
        headers = [(k, v) for k, v in scope["headers"] if k not in _DROPPED]
        inner = {**scope, SESSION_SCOPE_KEY: checked}
        path: str = scope["path"]
        if path == SANDBOXES or path.startswith(SANDBOXES + "/"):
            deployment = await self.guard.deployment(checked, header(scope, DEPLOYMENT_HEADER))
            token = self.guard.identity_token(deployment)
            headers.append((b"authorization", f"Bearer {token}".encode()))
        inner["headers"] = headers
        await self.app(inner, receive, send)
