"""``/healthz`` (200 once sandboxes can be created) and ``/metrics``."""

from __future__ import annotations

from collections import Counter

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from podbay.dataplane.metrics import CONTENT_TYPE


async def healthz(request: Request) -> Response:
    platform = request.app.state.platform
    status = platform.health()
    return JSONResponse(status, status_code=200 if status["ready"] else 503)


async def metrics(request: Request) -> Response:
    platform = request.app.state.platform
    rows = await platform.store.list_sandboxes()
    body = platform.metrics.render(Counter(r.state.value for r in rows))
    return Response(body, media_type=CONTENT_TYPE)


routes = [
    Route("/healthz", healthz, methods=["GET"]),
    Route("/metrics", metrics, methods=["GET"]),
]
