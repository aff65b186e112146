"""``/api/v1/sandboxes``: the control-plane API of DESIGN.md."""

from __future__ import annotations

import time

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from podbay.dataplane.credentials import MAX_SHARE_SECONDS, mint_share
from podbay.dataplane.environment_seam import Building
from podbay.domain import Deployment
from podbay.domain.egress import AUDIT_SIZE
from podbay.errors import ApiError
from podbay.wire.codec import WireError, dumps, loads
from podbay.wire.codes import ErrorCode
from podbay.wire.control import (
    AttachRequest,
    EgressAudit,
    ForkRequest,
    ForkResult,
    NetworkPolicy,
    Preparing,
    SandboxList,
    ShareRequest,
    ShareUrl,
)
from podbay.wire.paths import PREFER_ASYNC, PREFER_HEADER, SANDBOXES

from .. import views
from ..services.options import egress_of, egress_row, label_filter, network_doc, options_of
from ..services.sandboxes import check_name
from ..tokens import bearer

JSON = "application/json"


def _json(model: object, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(dumps(model), status_code=status, media_type=JSON, headers=headers)


async def _deployment(request: Request) -> Deployment:
    platform = request.app.state.platform
    deployment: Deployment = await platform.deployments.authenticate(
        bearer(request.headers.get("authorization"))
    )
    return deployment


async def attach(request: Request) -> Response:
    started = time.perf_counter()
    platform = request.app.state.platform
    deployment = await _deployment(request)
    raw = await request.body()
    try:
        body = loads(AttachRequest, raw) if raw.strip() else AttachRequest()
    except WireError as exc:
        raise ApiError(ErrorCode.REQUEST_INVALID, f"invalid attach body: {exc}") from None
    check_name(request.path_params["name"])  # refused before its options, as documented
    options = options_of(body, platform.settings)
    # A client that predates 202 (the reference's) only knows 200: the build is
    # waited for a while, so one finishing meanwhile is answered 200. A client
    # that says it handles 202 (Prefer: respond-async) gets it at once.
    hold = (
        0.0
        if PREFER_ASYNC in request.headers.get(PREFER_HEADER, "").lower()
        else platform.settings.server.attach_hold_seconds
    )
    result = await platform.sandboxes.attach_holding(
        deployment, request.path_params["name"], body.class_, options, hold
    )
    if isinstance(result, Building):
        return _json(
            Preparing(name=request.path_params["name"], progress=result.progress),
            202,
            {"Retry-After": str(result.retry_after_seconds)},
        )
    platform.metrics.attach.labels(result.start).observe(time.perf_counter() - started)
    return _json(views.handle(result, body.class_))


async def get_one(request: Request) -> Response:
    platform = request.app.state.platform
    sandbox = await platform.sandboxes.get(await _deployment(request), request.path_params["name"])
    return _json(views.record(sandbox, lost=platform.sandboxes.lost(sandbox)))


async def list_all(request: Request) -> Response:
    platform = request.app.state.platform
    deployment = await _deployment(request)
    # ``?label=k=v``, repeated: sandboxes carrying every one of them.
    labels = label_filter(request.query_params.getlist("label"))
    sandboxes = await platform.sandboxes.list(deployment, labels)
    lost = platform.sandboxes.lost
    return _json(SandboxList(sandboxes=[views.record(s, lost=lost(s)) for s in sandboxes]))


async def stop(request: Request) -> Response:
    platform = request.app.state.platform
    await platform.sandboxes.stop(await _deployment(request), request.path_params["name"])
    return Response(status_code=204)


async def delete(request: Request) -> Response:
    platform = request.app.state.platform
    await platform.sandboxes.delete(await _deployment(request), request.path_params["name"])
    return Response(status_code=204)


async def get_network(request: Request) -> Response:
    platform = request.app.state.platform
    policy = await platform.sandboxes.network(
        await _deployment(request), request.path_params["name"]
    )
    return _json(network_doc(policy))


async def put_network(request: Request) -> Response:
    """Change the sandbox's egress policy; answered once it is in force."""
    platform = request.app.state.platform
    deployment = await _deployment(request)
    check_name(request.path_params["name"])
    try:
        body = loads(NetworkPolicy, await request.body())
    except WireError as exc:
        raise ApiError(ErrorCode.REQUEST_INVALID, f"invalid network body: {exc}") from None
    policy = egress_of(body)
    await platform.sandboxes.set_network(deployment, request.path_params["name"], policy)
    return _json(network_doc(policy))


async def fork(request: Request) -> Response:
    """Copy the sandbox into new running ones (docs/fork.md)."""
    platform = request.app.state.platform
    deployment = await _deployment(request)
    check_name(request.path_params["name"])
    try:
        body = loads(ForkRequest, await request.body())
    except WireError as exc:
        raise ApiError(ErrorCode.REQUEST_INVALID, f"invalid fork body: {exc}") from None
    if (body.name is None) == (body.names is None):
        raise ApiError(
            ErrorCode.SANDBOX_FORK_INVALID, 'give the new sandbox\'s "name" or a list of "names"'
        )
    names = [body.name] if body.name is not None else list(body.names or [])
    attached, held = await platform.sandboxes.fork(deployment, request.path_params["name"], names)
    source_class = attached[0].sandbox.asked_class if attached else "default"
    return _json(
        ForkResult(
            sandboxes=[views.handle(a, source_class) for a in attached],
            paused_ms=round(held * 1000, 1),
        )
    )


async def get_egress(request: Request) -> Response:
    """The sandbox's egress audit: destinations reached or refused lately."""
    platform = request.app.state.platform
    rows = await platform.sandboxes.egress_audit(
        await _deployment(request), request.path_params["name"]
    )
    # Any set that is full holds AUDIT_SIZE destinations, so at least as many
    # distinct ones are listed (a sandbox's packets meet one hook or the other).
    full = len({(r.address, r.protocol, r.port) for r in rows}) >= AUDIT_SIZE
    return _json(EgressAudit(destinations=[egress_row(row) for row in rows], full=full))


async def share(request: Request) -> Response:
    """A signed, expiring URL for one port of the sandbox, for a person to open."""
    platform = request.app.state.platform
    deployment = await _deployment(request)
    sandbox = await platform.sandboxes.get(deployment, request.path_params["name"])
    raw_port = request.path_params["port"]
    if not raw_port.isdigit() or len(raw_port) > 5 or not 1 <= int(raw_port) <= 65535:
        raise ApiError(ErrorCode.REQUEST_INVALID, "port must be a number from 1 to 65535")
    raw = await request.body()
    try:
        body = loads(ShareRequest, raw) if raw.strip() else ShareRequest()
    except WireError as exc:
        raise ApiError(ErrorCode.REQUEST_INVALID, f"invalid share body: {exc}") from None
    if not 1 <= body.expires_in_seconds <= MAX_SHARE_SECONDS:
        raise ApiError(
            ErrorCode.REQUEST_INVALID, f"expires_in_seconds must be from 1 to {MAX_SHARE_SECONDS}"
        )
    token, expires = mint_share(
        platform.keys,
        sandbox_id=sandbox.id,
        port=int(raw_port),
        ttl_seconds=body.expires_in_seconds,
    )
    url = f"{platform.nodes.of(sandbox).share_base()}{token}/"
    return _json(ShareUrl(url=url, expires_at=expires))


routes = [
    Route(SANDBOXES, list_all, methods=["GET"]),
    Route(SANDBOXES + "/{name}", attach, methods=["PUT"]),
    Route(SANDBOXES + "/{name}", get_one, methods=["GET"]),
    Route(SANDBOXES + "/{name}", delete, methods=["DELETE"]),
    Route(SANDBOXES + "/{name}/stop", stop, methods=["POST"]),
    Route(SANDBOXES + "/{name}/network", get_network, methods=["GET"]),
    Route(SANDBOXES + "/{name}/network", put_network, methods=["PUT"]),
    Route(SANDBOXES + "/{name}/egress", get_egress, methods=["GET"]),
    Route(SANDBOXES + "/{name}/fork", fork, methods=["POST"]),
    Route(SANDBOXES + "/{name}/ports/{port}/share", share, methods=["POST"]),
]
