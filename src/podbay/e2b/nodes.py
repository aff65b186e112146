"""E2B's sandbox API on a cluster's nodes: the data-plane tier, so commands
and files never pass through a control replica.

A node has no store: what :meth:`E2BService.authorize` and
:meth:`E2BService.reach` read there, it asks the control plane for, over the
internal API with its node credential (:data:`REACH`): whether the caller's
token or key reaches the sandbox (the deployment and the E2B row), and, for
a call that goes on to the sandbox, its attach (resuming a paused one). Then
the same handlers as ``podbay serve``'s relay the call to the sandbox's
gateway: this node's, or over HTTP the node that holds it.
"""

from __future__ import annotations

import contextvars
import json
import math
from collections.abc import Callable
from datetime import datetime
from typing import Any, cast, get_args

import httpx
from starlette.responses import JSONResponse, Response

from podbay.asgi import ASGIApp
from podbay.control.services.sandboxes import Attached
from podbay.dataplane import nodeapi
from podbay.domain import Deployment, Sandbox, SandboxOptions, SandboxState, StartKind
from podbay.store.e2b import E2BSandbox
from podbay.store.rows import at, dt, ts

from .error_responses import E2BError
from .inprocess import InProcessTransport
from .service import DEFAULT_TIMEOUT, E2BService

REACH = f"{nodeapi.PREFIX}/e2b/reach"


# -- the documents ------------------------------------------------------------------
def _row_doc(row: E2BSandbox) -> dict[str, Any]:
    return {
        "sandbox_id": row.sandbox_id,
        "deployment_id": row.deployment_id,
        "template": row.template,
        "metadata": row.metadata,
        "env_vars": row.env_vars,
        "started_at": ts(row.started_at),
        "end_at": ts(row.end_at),
        "on_timeout": row.on_timeout,
        "paused_at": ts(row.paused_at),
    }


def _row_from(doc: dict[str, Any]) -> E2BSandbox:
    return E2BSandbox(
        sandbox_id=str(doc["sandbox_id"]),
        deployment_id=str(doc["deployment_id"]),
        template=str(doc["template"]),
        metadata=dict(doc["metadata"]),
        env_vars=dict(doc["env_vars"]),
        started_at=at(float(doc["started_at"])),
        end_at=at(float(doc["end_at"])),
        on_timeout=str(doc["on_timeout"]),
        paused_at=dt(doc["paused_at"]),
    )


def _sandbox_doc(s: Sandbox) -> dict[str, Any]:
    return {
        "id": s.id,
        "deployment_id": s.deployment_id,
        "account": s.account,
        "name": s.name,
        "class": s.class_,
        "state": s.state.value,
        "machine_id": s.machine_id,
        "created_at": ts(s.created_at),
        "last_active_at": ts(s.last_active_at),
        "started_at": ts(s.started_at),
        "ceiling_at": ts(s.ceiling_at),
        "incarnation": s.incarnation,
        "version": s.version,
        "suspended_at": ts(s.suspended_at),
        "node": s.node,
        "routed_on": s.routed_on,
        "asked_class": s.asked_class,
        "options": s.options.to_json(),
    }


def _sandbox_from(doc: dict[str, Any]) -> Sandbox:
    return Sandbox(
        id=str(doc["id"]),
        deployment_id=str(doc["deployment_id"]),
        account=str(doc["account"]),
        name=str(doc["name"]),
        class_=str(doc["class"]),
        state=SandboxState(doc["state"]),
        machine_id=str(doc["machine_id"]),
        created_at=at(float(doc["created_at"])),
        last_active_at=at(float(doc["last_active_at"])),
        started_at=dt(doc["started_at"]),
        ceiling_at=dt(doc["ceiling_at"]),
        incarnation=int(doc["incarnation"]),
        version=int(doc["version"]),
        suspended_at=dt(doc["suspended_at"]),
        node=str(doc["node"]),
        routed_on=doc["routed_on"],
        asked_class=str(doc["asked_class"]),
        options=SandboxOptions.from_json(doc["options"]),
    )


# -- the control plane's side -------------------------------------------------------------
async def answer_node(service: E2BService, doc: dict[str, Any]) -> Response:
    """A node's ``REACH``: E2B's refusals in E2B's shape (the node answers
    them to the SDK as they are)."""
    sandbox_id = doc.get("sandbox_id")
    access, api_key = doc.get("access_token"), doc.get("api_key")
    try:
        if not isinstance(sandbox_id, str):
            raise E2BError(400, "REQUEST_INVALID", "sandbox_id must be a string")
        deployment, row = await service.authorize(
            sandbox_id,
            access if isinstance(access, str) else None,
            api_key if isinstance(api_key, str) else None,
        )
        answer: dict[str, Any] = {
            "deployment": nodeapi.deployment_doc(deployment),
            "row": _row_doc(row),
        }
        if doc.get("attach"):
            attached = await service.reach(deployment, sandbox_id, row)
            answer["attached"] = {
                "sandbox": _sandbox_doc(attached.sandbox),
                "start": attached.start,
                "credential": attached.credential,
                "expires_at": ts(attached.expires_at),
                "endpoint": attached.endpoint,
            }
    except E2BError as exc:
        return _refusal(exc)
    return JSONResponse(answer)


def _refusal(exc: E2BError) -> Response:
    body = {"code": exc.status, "message": exc.message, "error_code": exc.code}
    if exc.retry_after is not None:
        body["retry_after"] = exc.retry_after
    return JSONResponse(body, status_code=exc.status)


# -- the node's side -------------------------------------------------------------------------
#: The caller's credentials, from ``authorize`` to ``reach`` within one request.
_CALLER: contextvars.ContextVar[tuple[str | None, str | None]] = contextvars.ContextVar(
    "e2b_caller"
)


class NodeE2BService(E2BService):
    """The sandbox API's service on a node: the store's answers come from the
    control plane. Only what the sandbox API's handlers use is here
    (``authorize``, ``reach``, ``http``, ``closers``); E2B's REST API stays
    the control plane's."""

    # E2BService's own __init__ wants the store and the sandbox service, which
    # a node has not: this one sets what the sandbox API's handlers use.
    def __init__(
        self,
        control_url: str,
        credential: Callable[[], str | None],
        local_gateway: tuple[str, ASGIApp] | None = None,
    ) -> None:
        self.closers: list[Callable[[], None]] = []
        # This node's own sandboxes: handed to its gateway in process, as under
        # ``podbay serve`` (another node's go over HTTP).
        transport: httpx.AsyncBaseTransport = httpx.AsyncHTTPTransport()
        if local_gateway is not None:
            transport = InProcessTransport(*local_gateway, transport)
        self.http = httpx.AsyncClient(timeout=httpx.Timeout(30.0, read=None), transport=transport)
        self._control = control_url.rstrip("/") + REACH
        self._credential = credential

    async def _ask(self, doc: dict[str, Any]) -> dict[str, Any]:
        credential = self._credential() or ""
        try:
            answer = await self.http.post(
                self._control,
                content=json.dumps(doc),
                headers={
                    "Authorization": f"Bearer {credential}",
                    "Content-Type": "application/json",
                },
                timeout=httpx.Timeout(120.0),
            )
        except httpx.HTTPError as exc:
            raise E2BError(
                503, "E2B_CONTROL_UNREACHABLE", f"the control plane did not answer: {exc}", 1
            ) from None
        try:
            body = answer.json()
        except ValueError:
            body = None
        if not isinstance(body, dict):
            raise E2BError(502, "E2B_CONTROL_INVALID", "the control plane's answer is not JSON")
        if answer.status_code != 200:
            code = body.get("error_code") or body.get("code") or "E2B_CONTROL_REFUSED"
            message = body.get("message") or body.get("error") or "refused"
            raise E2BError(answer.status_code, str(code), str(message), _retry_after(answer, body))
        return body

    async def authorize(
        self, sandbox_id: str, access: str | None, api_key: str | None
    ) -> tuple[Deployment, E2BSandbox]:
        _CALLER.set((access, api_key))
        body = await self._ask(
            {"sandbox_id": sandbox_id, "access_token": access, "api_key": api_key}
        )
        return nodeapi.deployment_from(body["deployment"]), _row_from(body["row"])

    async def reach(
        self,
        deployment: Deployment,
        sandbox_id: str,
        row: E2BSandbox | None = None,
        *,
        timeout_seconds: int = DEFAULT_TIMEOUT,
    ) -> Attached:
        access, api_key = _CALLER.get((None, None))
        body = await self._ask(
            {"sandbox_id": sandbox_id, "access_token": access, "api_key": api_key, "attach": True}
        )
        doc = body["attached"]
        return Attached(
            sandbox=_sandbox_from(doc["sandbox"]),
            start=_start(doc["start"]),
            credential=str(doc["credential"]),
            expires_at=_when(doc["expires_at"]),
            endpoint=str(doc["endpoint"]),
        )

    async def close(self) -> None:
        for closer in self.closers:
            closer()
        await self.http.aclose()


def _retry_after(answer: httpx.Response, body: dict[str, Any]) -> int | None:
    """The wait a refusal of the control plane names: E2B's body carries it as
    ``retry_after``, podbay's own refusals (``SANDBOXES_UNAVAILABLE`` while the
    nodes start) as ``Retry-After``; whole seconds, rounded up."""
    raw = body.get("retry_after", answer.headers.get("retry-after"))
    try:
        wait = float(raw) if isinstance(raw, int | float | str) else None
    except ValueError:
        return None
    return None if wait is None or wait < 0 else math.ceil(wait)


def _when(value: Any) -> datetime:
    return at(float(value))


def _start(value: Any) -> StartKind:
    if value not in get_args(StartKind):
        raise E2BError(502, "E2B_CONTROL_INVALID", f"unknown start kind {value!r}")
    return cast(StartKind, value)


def misdirected() -> Response:
    """A control replica's answer to sandbox traffic: it goes to the nodes."""
    body = {
        "code": 421,
        "message": "in a cluster, E2B_SANDBOX_URL is the nodes' address (their load "
        "balancer or one node): control replicas never carry commands or files",
        "error_code": "E2B_SANDBOX_URL_MISDIRECTED",
    }
    return JSONResponse(body, status_code=421)
