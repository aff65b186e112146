"""Which requests are E2B's, for ``podbay serve``'s ASGI entry: a request
whose ``Host`` is a ``get_host(port)`` address goes to that port of the
sandbox; one naming a sandbox in ``E2b-Sandbox-Id`` is for the sandbox API (so
``E2B_SANDBOX_URL`` may be the server's own URL), one under E2B's REST paths
for the control API. Nothing else is touched."""

from __future__ import annotations

from typing import TYPE_CHECKING

from podbay.asgi import ASGIApp, Receive, Scope, Send

from . import control, envd, hosts, interpreter, relay
from .service import E2BService

if TYPE_CHECKING:
    from podbay.control.services.sandboxes import SandboxService
    from podbay.runtime.base import Limits
    from podbay.store.base import Store

_SANDBOX_HEADER = relay.SANDBOX_ID_HEADER.encode()


class E2BApps:
    """E2B's fronts over the platform's own store and sandbox service (the
    pieces they use, not the platform: the platform builds them)."""

    def __init__(
        self,
        store: Store,
        sandboxes: SandboxService,
        limits: Limits,
        domain: str = "",
        *,
        local_gateway: tuple[str, ASGIApp] | None = None,
    ) -> None:
        self._serve(E2BService(store, sandboxes, local_gateway=local_gateway), limits, domain)

    @classmethod
    def sandbox_api(cls, service: E2BService) -> E2BApps:
        """The sandbox API alone (a cluster's node: E2B's REST API is the
        control plane's, so its paths are left to the node's own routes)."""
        apps = cls.__new__(cls)
        apps._serve(service, None)
        return apps

    def _serve(self, service: E2BService, limits: Limits | None, domain: str = "") -> None:
        self.service = service
        self.control = None if limits is None else control.build(service, limits, domain)
        self.envd = envd.build(service)
        self.interpreter = interpreter.build(service)
        self.hosts = hosts.HostProxy(service)

    def route(self, scope: Scope) -> ASGIApp | None:
        if scope["type"] not in ("http", "websocket"):
            return None
        if hosts.target(scope["headers"]) is not None:
            return self.hosts  # get_host(port)'s address, HTTP or WebSocket
        if scope["type"] != "http":
            return None
        if any(key == _SANDBOX_HEADER for key, _ in scope["headers"]):
            return self.interpreter if interpreter.is_interpreter(scope["headers"]) else self.envd
        path: str = scope["path"]
        if path == "/files" and b"signature=" in scope["query_string"]:
            return self.envd  # a signed file URL: it names its sandbox by its signature
        if any(path == p or path.startswith(p + "/") for p in control.PREFIXES):
            return self.control
        return None

    def is_sandbox_traffic(self, app: ASGIApp | None) -> bool:
        """Whether ``route`` chose the sandbox API (commands, files, ports)."""
        return app is not None and app is not self.control

    async def close(self) -> None:
        await self.service.close()

    def in_front_of(self, app: ASGIApp, *, sandbox_traffic: ASGIApp | None = None) -> ASGIApp:
        """``app`` with E2B's requests taken first; with ``sandbox_traffic``, the
        sandbox API's requests go there instead (a control replica's refusal)."""

        async def front(scope: Scope, receive: Receive, send: Send) -> None:
            chosen = self.route(scope)
            if sandbox_traffic is not None and self.is_sandbox_traffic(chosen):
                chosen = sandbox_traffic
            await (chosen or app)(scope, receive, send)

        return front

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        app = self.route(scope)
        assert app is not None
        await app(scope, receive, send)
