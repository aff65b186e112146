"""Which requests are E2B's, for ``podbay serve``'s ASGI entry: a request
naming a sandbox in ``E2b-Sandbox-Id`` is for the sandbox API (so
``E2B_SANDBOX_URL`` may be the server's own URL), one under E2B's REST paths
for the control API. Nothing else is touched."""

from __future__ import annotations

from typing import TYPE_CHECKING

from starlette.applications import Starlette

from podbay.asgi import Receive, Scope, Send

from . import control, envd, interpreter, relay
from .service import E2BService

if TYPE_CHECKING:
    from podbay.control.app import Platform

_SANDBOX_HEADER = relay.SANDBOX_ID_HEADER.encode()


class E2BApps:
    def __init__(self, platform: Platform) -> None:
        self.service = E2BService(platform.store, platform.sandboxes)
        self.control = control.build(self.service, platform.limits)
        self.envd = envd.build(self.service)
        self.interpreter = interpreter.build(self.service)

    def route(self, scope: Scope) -> Starlette | None:
        if scope["type"] != "http":
            return None
        if any(key == _SANDBOX_HEADER for key, _ in scope["headers"]):
            return self.interpreter if interpreter.is_interpreter(scope["headers"]) else self.envd
        path: str = scope["path"]
        if any(path == p or path.startswith(p + "/") for p in control.PREFIXES):
            return self.control
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        app = self.route(scope)
        assert app is not None
        await app(scope, receive, send)
