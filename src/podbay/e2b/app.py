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
    from podbay.control.services.sandboxes import SandboxService
    from podbay.runtime.base import Limits
    from podbay.store.base import Store

_SANDBOX_HEADER = relay.SANDBOX_ID_HEADER.encode()


class E2BApps:
    """E2B's fronts over the platform's own store and sandbox service (the
    pieces they use, not the platform: the platform builds them)."""

    def __init__(self, store: Store, sandboxes: SandboxService, limits: Limits) -> None:
        self.service = E2BService(store, sandboxes)
        self.control = control.build(self.service, limits)
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
