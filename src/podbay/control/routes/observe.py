"""``/api/v1/sandboxes/{name}/metrics``, ``/events`` and ``/commands``: what
a sandbox uses, what happened to it and what ran in it (docs/observability.md),
for its deployment's token.

Metrics and the command log live on the node holding the sandbox; events in
the store. A sandbox of another deployment is unknown here: 404, as for the
other control calls.
"""

from __future__ import annotations

from datetime import datetime

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from podbay.domain import Deployment
from podbay.errors import ApiError
from podbay.wire.codec import parse_time
from podbay.wire.codes import ErrorCode
from podbay.wire.observe import METRICS_INTERVAL_SECONDS, CommandList, EventList, Metrics
from podbay.wire.paths import SANDBOXES

from ..services.sandboxes import check_name, not_found
from .sandboxes import _deployment, _json


def since_of(request: Request) -> datetime | None:
    """``?since=`` (RFC 3339): only what came after it."""
    raw = request.query_params.get("since")
    if raw is None:
        return None
    try:
        return parse_time(raw)
    except (ValueError, OverflowError):
        raise ApiError(
            ErrorCode.REQUEST_INVALID, "since must be an RFC 3339 time with its zone"
        ) from None


async def metrics(request: Request) -> Response:
    platform = request.app.state.platform
    since = since_of(request)
    sandbox = await platform.sandboxes.get(await _deployment(request), request.path_params["name"])
    samples = await platform.nodes.of(sandbox).metrics(sandbox.id, since)
    return _json(Metrics(interval_seconds=METRICS_INTERVAL_SECONDS, samples=samples))


async def events(request: Request) -> Response:
    """A removed sandbox's events stay readable by its name: 404 only for a
    name this deployment never had (or whose history aged out)."""
    platform = request.app.state.platform
    since = since_of(request)
    deployment = await _deployment(request)
    name = request.path_params["name"]
    check_name(name)
    found = await platform.store.list_events(deployment.id, name, since)
    if (
        not found
        and (since is None or not await platform.store.list_events(deployment.id, name))
        and await platform.store.get_sandbox(deployment.id, name) is None
    ):
        raise not_found(name)
    return _json(EventList(events=found))


def command_log_on(deployment: Deployment) -> bool:
    """The deployment's ``sandbox.command_log`` (validated when registered)."""
    section = deployment.sandbox_section or {}
    return section.get("command_log", True) is not False


async def commands(request: Request) -> Response:
    """Off for the deployment: the node is never asked, and nothing is kept."""
    platform = request.app.state.platform
    since = since_of(request)
    deployment = await _deployment(request)
    sandbox = await platform.sandboxes.get(deployment, request.path_params["name"])
    if not command_log_on(deployment):
        return _json(CommandList(enabled=False))
    found = await platform.nodes.of(sandbox).commands(sandbox)
    return _json(CommandList(commands=[c for c in found if since is None or c.at > since]))


routes = [
    Route(SANDBOXES + "/{name}/metrics", metrics, methods=["GET"]),
    Route(SANDBOXES + "/{name}/events", events, methods=["GET"]),
    Route(SANDBOXES + "/{name}/commands", commands, methods=["GET"]),
]
