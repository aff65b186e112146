"""``/api/v1/deployments`` and ``/api/v1/nodes``: the operator's API.

Called with an operator token (``Authorization: Bearer``, from ``podbay admin
token``) or an operator's console session (:mod:`podbay.console.layer`). A
deployment's identity token or session is refused 403 ``OPERATOR_REQUIRED``.
The same work as ``podbay deployment create|delete|token|e2b-key`` and
``podbay node list|drain``, through the server's own services.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from podbay.console.layer import SESSION_SCOPE_KEY
from podbay.console.tokens import Session, verify_operator_token
from podbay.control.tokens import bearer
from podbay.errors import ApiError, DeploymentError
from podbay.wire.codec import format_time
from podbay.wire.codes import ErrorCode
from podbay.wire.paths import DEPLOYMENTS, NODES

#: A deployment made from the console runs plain sandboxes unless a spec says more.
DEFAULT_SPEC = "sandbox:\n  toolchain: never\n"


async def _operator(request: Request) -> Any:
    """The platform, once the caller is proven the operator."""
    platform = request.app.state.platform
    session: Session | None = request.scope.get(SESSION_SCOPE_KEY)
    if session is not None:
        if session.scope != "operator":
            raise ApiError(ErrorCode.OPERATOR_REQUIRED, "this call is the operator's")
        return platform
    token = bearer(request.headers.get("authorization"))
    if token is None:
        raise ApiError(
            ErrorCode.TOKEN_INVALID, "an operator token is required (Authorization: Bearer)"
        )
    guard = platform.console_guard
    try:
        await verify_operator_token(
            guard.keys, token, issuer=guard.issuer, generation=guard.generation
        )
    except ApiError:
        try:
            await platform.deployments.authenticate(token)
        except ApiError:
            raise ApiError(ErrorCode.TOKEN_INVALID, "the operator token is not valid") from None
        raise ApiError(ErrorCode.OPERATOR_REQUIRED, "this call is the operator's") from None
    return platform


async def _body(request: Request) -> dict[str, Any]:
    raw = await request.body()
    if not raw.strip():
        return {}
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        body = None
    if not isinstance(body, dict):
        raise ApiError(ErrorCode.REQUEST_INVALID, "the body is a JSON object")
    return body


async def _deployment(platform: Any, name: str) -> Any:
    found = await platform.store.find_deployment(name)
    if found is None:
        raise ApiError(ErrorCode.DEPLOYMENT_NOT_FOUND, f"no deployment named {name!r}")
    return found


async def list_deployments(request: Request) -> Response:
    platform = await _operator(request)
    rows = []
    for d in await platform.deployments.list():
        sandboxes = await platform.store.list_sandboxes(deployment_id=d.id)
        rows.append(
            {
                "name": d.name,
                "account": d.account,
                "sandbox": d.declares_sandbox,
                "created_at": format_time(d.created_at),
                "updated_at": format_time(d.updated_at),
                "sandboxes": sum(1 for s in sandboxes if s.state.visible),
            }
        )
    return JSONResponse({"deployments": sorted(rows, key=lambda r: r["name"])})


async def create_deployment(request: Request) -> Response:
    platform = await _operator(request)
    body = await _body(request)
    name, spec = body.get("name"), body.get("spec", DEFAULT_SPEC)
    if not isinstance(name, str) or not isinstance(spec, str):
        raise ApiError(ErrorCode.REQUEST_INVALID, '{"name": "...", "spec": "astropods.yml"?}')
    if await platform.store.find_deployment(name) is not None:
        raise ApiError(ErrorCode.DEPLOYMENT_EXISTS, f"a deployment named {name!r} exists")
    try:
        deployment, token = await platform.deployments.create(name, spec)
    except DeploymentError as exc:
        code = ErrorCode.DEPLOYMENT_EXISTS if "exists" in str(exc) else ErrorCode.REQUEST_INVALID
        raise ApiError(code, str(exc)) from None
    return JSONResponse(
        {"name": deployment.name, "token": token, "created_at": format_time(deployment.created_at)},
        status_code=201,
    )


async def delete_deployment(request: Request) -> Response:
    platform = await _operator(request)
    await _deployment(platform, request.path_params["name"])
    try:
        await platform.deployments.delete(request.path_params["name"])
    except DeploymentError:  # deleted meanwhile
        raise ApiError(ErrorCode.DEPLOYMENT_NOT_FOUND, "no such deployment") from None
    return Response(status_code=204)


async def new_token(request: Request) -> Response:
    from podbay.e2b.service import issue_key

    platform = await _operator(request)
    kind = (await _body(request)).get("kind", "identity")
    if kind not in ("identity", "e2b"):
        raise ApiError(ErrorCode.REQUEST_INVALID, 'kind is "identity" or "e2b"')
    deployment = await _deployment(platform, request.path_params["name"])
    if kind == "e2b":
        token = await issue_key(platform.store, deployment)
    else:
        token = platform.deployments.token_for(deployment)
    return JSONResponse({"kind": kind, "token": token})


def _cluster_nodes(platform: Any) -> Any:
    """The cluster's node set, or None in ``podbay serve``."""
    from podbay.control.remote import ClusterNodes

    return platform.nodes if isinstance(platform.nodes, ClusterNodes) else None


async def list_nodes(request: Request) -> Response:
    platform = await _operator(request)
    cluster = _cluster_nodes(platform)
    if cluster is None:
        running = [s for s in await platform.store.list_sandboxes() if s.state.visible]
        # ``cluster`` tells the page whether draining means anything here.
        return JSONResponse(
            {
                "cluster": False,
                "nodes": [
                    {
                        "name": "local",
                        "url": platform.base_url,
                        "state": "ready",
                        "classes": sorted(platform.classes.available),
                        "sandboxes": len(running),
                        "capacity": None,
                    }
                ],
            }
        )
    now = datetime.now(UTC)
    lost_after = platform.settings.cluster.node_lost_seconds
    return JSONResponse(
        {
            "cluster": True,
            "nodes": [
                {
                    "name": r.name,
                    "url": r.url,
                    "state": r.state(now, lost_after),
                    "classes": r.report.get("classes", []),
                    "sandboxes": r.report.get("running", 0),
                    "capacity": r.report.get("capacity"),
                    "heartbeat_at": format_time(r.heartbeat_at),
                }
                for r in await platform.store.list_nodes()
            ],
        }
    )


async def drain_node(request: Request) -> Response:
    """Marks the node drained: it takes no new sandboxes. Moving its stopped
    sandboxes' disks is ``podbay node drain``'s work (docs/cluster.md)."""
    platform = await _operator(request)
    name = request.path_params["name"]
    if _cluster_nodes(platform) is None:
        raise ApiError(ErrorCode.NOT_A_CLUSTER, "podbay serve has one node: nothing to drain to")
    if not await platform.store.drain_node(name):
        raise ApiError(ErrorCode.NODE_NOT_FOUND, f"no node named {name!r}")
    return JSONResponse({"name": name, "state": "draining"}, status_code=202)


routes = [
    Route(DEPLOYMENTS, list_deployments, methods=["GET"]),
    Route(DEPLOYMENTS, create_deployment, methods=["POST"]),
    Route(DEPLOYMENTS + "/{name}", delete_deployment, methods=["DELETE"]),
    Route(DEPLOYMENTS + "/{name}/token", new_token, methods=["POST"]),
    Route(NODES, list_nodes, methods=["GET"]),
    Route(NODES + "/{name}/drain", drain_node, methods=["POST"]),
]
