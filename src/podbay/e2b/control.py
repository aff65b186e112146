"""E2B's REST API (``E2B_API_URL``), the calls ``e2b``'s ``Sandbox`` makes:
create, connect, get info, list (v1 and v2), kill, set timeout, pause,
resume, a sandbox's metrics (:mod:`.metrics`) and its network
(:mod:`.network`). Authenticated by ``X-API-Key``; a key reaches its
deployment's sandboxes only. Anything else under E2B's paths answers 501 in
E2B's shape.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import parse_qsl, unquote

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from podbay.domain import Deployment, Sandbox, SandboxState
from podbay.domain.egress import OPEN
from podbay.store.e2b import E2BSandbox

from . import hosts
from .error_responses import E2BError, handlers, not_implemented
from .list_query import ListQuery, list_query
from .metrics import metric, unix_param
from .network import e2b_view, policy_of, update_policy
from .service import DEFAULT_TIMEOUT, MAX_TIMEOUT, E2BService, adopted

#: Paths of E2B's API (none is podbay's own: that lives under /api/v1).
PREFIXES = (
    "/sandboxes",
    "/v2/sandboxes",
    "/templates",
    "/v2/templates",
    "/v3/templates",
    "/default-templates",
    "/snapshots",
    "/volumes",
    "/secrets",
    "/teams",
    "/api-keys",
    "/access-tokens",
)
#: The envd version podbay's sandbox API behaves as: 0.5.x's features (default
#: user, stdin flag, octet-stream uploads) without the later ones.
ENVD_VERSION = "0.5.7"
CLIENT_ID = "podbay"
JSON = "application/json"


def _json(value: object, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(json.dumps(value), status, media_type=JSON, headers=headers)


def _time(value: datetime) -> str:
    return value.isoformat().replace("+00:00", "Z")


def _domain(request: Request) -> str:
    """``get_host``'s domain: the setting, else the address this request reached."""
    configured: str = request.app.state.domain
    return configured or hosts.domain_for(request)


def _service(request: Request) -> E2BService:
    service: E2BService = request.app.state.e2b
    return service


async def _deployment(request: Request) -> Deployment:
    return await _service(request).deployment_for_key(request.headers.get("x-api-key"))


async def _body(request: Request) -> dict[str, Any]:
    raw = await request.body()
    if not raw.strip():
        return {}
    try:
        body = json.loads(raw)
    except ValueError:
        raise E2BError(400, "REQUEST_INVALID", "the body is not JSON") from None
    if not isinstance(body, dict):
        raise E2BError(400, "REQUEST_INVALID", "the body must be a JSON object")
    return body


def _strings(body: dict[str, Any], field: str) -> dict[str, str]:
    value = body.get(field)
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise E2BError(400, "REQUEST_INVALID", f"{field} must be an object of strings")
    return value


def _timeout(body: dict[str, Any], default: int | None = DEFAULT_TIMEOUT) -> int:
    value = body.get("timeout", default)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value <= MAX_TIMEOUT:
        raise E2BError(400, "REQUEST_INVALID", f"timeout must be whole seconds, 1 to {MAX_TIMEOUT}")
    return value


def _state(sandbox: Sandbox) -> str:
    running = sandbox.state in (SandboxState.RUNNING, SandboxState.CREATING)
    return "running" if running else "paused"


async def _sandbox_json(service: E2BService, row: E2BSandbox, request: Request) -> dict[str, Any]:
    """E2B's ``Sandbox``: what create and connect answer."""
    return {
        "templateID": row.template,
        "sandboxID": row.sandbox_id,
        "clientID": CLIENT_ID,
        "envdVersion": ENVD_VERSION,
        # Always sent (E2B sends it for secure sandboxes only): the SDK then
        # sends it on every sandbox call, and podbay lets nobody in without it.
        "envdAccessToken": await service.access_token(row.sandbox_id),
        # e2b-code-interpreter sends this one, not the access token, on its
        # context calls: the same credential, so nothing gets in without it.
        "trafficAccessToken": await service.access_token(row.sandbox_id),
        # get_host(port) is "{port}-{sandboxID}.{domain}" (docs/e2b.md): this
        # server's own address, which routes such a Host to the sandbox's port.
        "domain": _domain(request),
    }


def _listed(row: E2BSandbox, sandbox: Sandbox, request: Request) -> dict[str, Any]:
    limits = request.app.state.limits
    return {
        "templateID": row.template,
        "sandboxID": row.sandbox_id,
        "clientID": CLIENT_ID,
        "startedAt": _time(row.started_at),
        "endAt": _time(row.end_at),
        "cpuCount": max(1, round(limits.cpus)),
        "memoryMB": limits.memory_bytes // (1024 * 1024),
        "diskSizeMB": limits.disk_bytes // (1024 * 1024),
        "state": _state(sandbox),
        "envdVersion": ENVD_VERSION,
        "metadata": row.metadata,
    }


async def create(request: Request) -> Response:
    service = _service(request)
    deployment = await _deployment(request)
    body = await _body(request)
    template = body.get("templateID")
    if not isinstance(template, str) or not template:
        raise E2BError(400, "REQUEST_INVALID", "templateID is required")
    for field in ("volumeMounts", "mcp", "iam"):
        if body.get(field):
            raise not_implemented(field)
    network = policy_of(body.get("allow_internet_access"), body.get("network"))
    row = await service.create(
        deployment,
        template=template,
        timeout_seconds=_timeout(body),
        metadata=_strings(body, "metadata"),
        env_vars=_strings(body, "envVars"),
        on_timeout=_on_timeout(body),
        network=network,
    )
    return _json(await _sandbox_json(service, row, request), 201)


def _on_timeout(body: dict[str, Any]) -> str:
    """``autoPause``: pause at the timeout instead of killing. ``autoResume``
    is accepted either way: podbay's sandbox API always resumes a paused
    sandbox it is asked to reach."""
    auto_pause = body.get("autoPause", False)
    if not isinstance(auto_pause, bool):
        raise E2BError(400, "REQUEST_INVALID", "autoPause must be true or false")
    resume = body.get("autoResume")
    if resume is not None and not (isinstance(resume, dict) and "enabled" in resume):
        raise E2BError(400, "REQUEST_INVALID", 'autoResume must be {"enabled": true|false}')
    return "pause" if auto_pause else "kill"


async def connect(request: Request) -> Response:
    service = _service(request)
    deployment = await _deployment(request)
    sandbox_id = request.path_params["sandbox_id"]
    row = await service.row(deployment, sandbox_id)
    timeout = _timeout(await _body(request))
    # Resumes a paused one, which then runs `timeout` from now.
    await service.reach(deployment, sandbox_id, row, timeout_seconds=timeout)
    # A running one's timeout is only ever extended (E2B's rule).
    if row.paused_at is None and row.end_at < service.clock() + timedelta(seconds=timeout):
        await service.set_timeout(deployment, sandbox_id, timeout)
    return _json(await _sandbox_json(service, row, request), 201)


async def get_info(request: Request) -> Response:
    service = _service(request)
    deployment = await _deployment(request)
    sandbox_id = request.path_params["sandbox_id"]
    row = await service.row(deployment, sandbox_id)
    sandbox = await _podbay_sandbox(service, deployment, sandbox_id)
    detail = _listed(row, sandbox, request)
    detail["envdAccessToken"] = await service.access_token(sandbox_id)
    detail["domain"] = _domain(request)
    detail["lifecycle"] = {"onTimeout": row.on_timeout, "autoResume": True}
    internet, network = e2b_view(sandbox.options.network or OPEN)
    detail["allowInternetAccess"] = internet
    if network is not None:
        detail["network"] = network
    return _json(detail)


async def set_network(request: Request) -> Response:
    """E2B's ``update_network``: the whole egress configuration replaced, in
    force when this answers (podbay's ``PUT .../network``)."""
    service = _service(request)
    deployment = await _deployment(request)
    sandbox_id = request.path_params["sandbox_id"]
    policy = update_policy(await _body(request))
    await service.row(deployment, sandbox_id)
    await _podbay_sandbox(service, deployment, sandbox_id)  # one gone meanwhile: 404
    await service.sandboxes.set_network(deployment, sandbox_id, policy)
    return Response(status_code=204)


async def _podbay_sandbox(service: E2BService, deployment: Deployment, sandbox_id: str) -> Sandbox:
    from podbay.errors import ApiError
    from podbay.wire.codes import ErrorCode

    from .service import sandbox_not_found

    try:
        return await service.sandboxes.get(deployment, sandbox_id)
    except ApiError as exc:
        if exc.code is ErrorCode.SANDBOX_NOT_FOUND:
            await service.rows.delete_e2b_sandbox(sandbox_id)
            raise sandbox_not_found(sandbox_id) from None
        raise


def _metadata_filter(raw: str | None) -> dict[str, str]:
    """``metadata=k%3Dv%26k2%3Dv2`` (the SDK url-encodes an url-encoded query)."""
    if not raw:
        return {}
    return {unquote(k): unquote(v) for k, v in parse_qsl(raw, keep_blank_values=True)}


async def _matching(
    request: Request, states: set[str], query: ListQuery | None = None
) -> list[dict[str, Any]]:
    service = _service(request)
    deployment = await _deployment(request)
    wanted = _metadata_filter(request.query_params.get("metadata"))
    podbay = {s.name: s for s in await service.sandboxes.list(deployment)}
    rows = {
        r.sandbox_id: r for r in await service.rows.list_e2b_sandboxes(deployment_id=deployment.id)
    }
    now = service.clock()
    # Made through podbay's own API: listed as its E2B row would be (made
    # when E2B's API first names it); one deleted there is gone here too.
    made = [rows.get(s.name) or adopted(s, now) for s in podbay.values()]
    out = []
    newest_first = query is not None and query.newest_first
    for row in sorted(made, key=lambda r: (r.started_at, r.sandbox_id), reverse=newest_first):
        sandbox = podbay[row.sandbox_id]
        if any(row.metadata.get(k) != v for k, v in wanted.items()):
            continue
        if query is not None and not query.admits(row):
            continue
        listed = _listed(row, sandbox, request)
        if listed["state"] in states:
            out.append(listed)
    return out


async def list_v1(request: Request) -> Response:
    return _json(await _matching(request, {"running"}))


async def list_v2(request: Request) -> Response:
    raw_states = request.query_params.get("state")
    states = set(raw_states.split(",")) if raw_states else {"running", "paused"}
    if not states <= {"running", "paused"}:
        raise E2BError(400, "REQUEST_INVALID", "state is running, paused or both")
    raw_limit = request.query_params.get("limit", "100")
    if not raw_limit.isdigit() or not 1 <= int(raw_limit) <= 1000:
        raise E2BError(400, "REQUEST_INVALID", "limit must be 1 to 1000")
    limit = int(raw_limit)
    found = await _matching(request, states, list_query(request.query_params))
    token = request.query_params.get("nextToken")
    if token:  # the id the previous page ended before
        ids = [s["sandboxID"] for s in found]
        if token not in ids:
            raise E2BError(400, "REQUEST_INVALID", "nextToken is not one this server gave")
        found = found[ids.index(token) :]
    page, rest = found[:limit], found[limit:]
    headers = {"X-Next-Token": rest[0]["sandboxID"]} if rest else None
    return _json(page, headers=headers)


async def kill(request: Request) -> Response:
    service = _service(request)
    await service.kill(await _deployment(request), request.path_params["sandbox_id"])
    return Response(status_code=204)


async def set_timeout(request: Request) -> Response:
    service = _service(request)
    timeout = _timeout(await _body(request), default=None)
    await service.set_timeout(
        await _deployment(request), request.path_params["sandbox_id"], timeout
    )
    return Response(status_code=204)


async def refresh(request: Request) -> Response:
    """E2B's keep-alive: the sandbox lives at least ``duration`` more seconds
    (its timeout is only ever extended here)."""
    service = _service(request)
    deployment = await _deployment(request)
    sandbox_id = request.path_params["sandbox_id"]
    body = await _body(request)
    duration = body.get("duration", DEFAULT_TIMEOUT)
    if isinstance(duration, bool) or not isinstance(duration, int) or not 0 <= duration <= 3600:
        raise E2BError(400, "REQUEST_INVALID", "duration must be whole seconds, 0 to 3600")
    row = await service.row(deployment, sandbox_id)
    if row.end_at < service.clock() + timedelta(seconds=duration):
        await service.set_timeout(deployment, sandbox_id, duration)
    return Response(status_code=204)


async def pause(request: Request) -> Response:
    """podbay's suspend: memory and files kept; the next connect resumes it."""
    service = _service(request)
    await service.pause(await _deployment(request), request.path_params["sandbox_id"])
    return Response(status_code=204)


async def resume(request: Request) -> Response:
    return await connect(request)


async def unsupported(request: Request) -> Response:
    await _deployment(request)  # an unauthenticated caller learns nothing
    raise not_implemented(f"{request.method} {request.url.path}")


_ID = "/{sandbox_id}"


async def sandbox_metrics(request: Request) -> Response:
    service = _service(request)
    deployment = await _deployment(request)
    sandbox = await _podbay_sandbox(service, deployment, request.path_params["sandbox_id"])
    start, end = unix_param(request, "start"), unix_param(request, "end")
    samples = await service.sandboxes.nodes.of(sandbox).metrics(sandbox.id, None)
    limits = request.app.state.limits
    cpus = sandbox.options.cpus or limits.cpus
    return _json(
        [
            metric(s, cpus, limits.disk_bytes)
            for s in samples
            if (start is None or s.at >= start) and (end is None or s.at <= end)
        ]
    )


routes = [
    Route("/sandboxes", create, methods=["POST"]),
    Route("/v2/sandboxes", create, methods=["POST"]),
    Route("/sandboxes", list_v1, methods=["GET"]),
    Route("/v2/sandboxes", list_v2, methods=["GET"]),
    Route("/sandboxes" + _ID, get_info, methods=["GET"]),
    Route("/sandboxes" + _ID, kill, methods=["DELETE"]),
    Route("/sandboxes" + _ID + "/timeout", set_timeout, methods=["POST"]),
    Route("/sandboxes" + _ID + "/connect", connect, methods=["POST"]),
    Route("/v2/sandboxes" + _ID + "/connect", connect, methods=["POST"]),
    Route("/sandboxes" + _ID + "/pause", pause, methods=["POST"]),
    Route("/sandboxes" + _ID + "/refreshes", refresh, methods=["POST"]),
    Route("/sandboxes" + _ID + "/resume", resume, methods=["POST"]),
    Route("/sandboxes" + _ID + "/metrics", sandbox_metrics, methods=["GET"]),
    Route("/sandboxes" + _ID + "/network", set_network, methods=["PUT"]),
    Route("/{rest:path}", unsupported, methods=["GET", "POST", "PUT", "PATCH", "DELETE"]),
]


def build(service: E2BService, limits: object, domain: str = "") -> Starlette:
    app = Starlette(routes=routes, exception_handlers=handlers)
    app.state.e2b = service
    app.state.limits = limits
    app.state.domain = domain
    return app
