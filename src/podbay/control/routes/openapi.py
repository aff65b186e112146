"""``/openapi.json``: the control plane's OpenAPI 3.1 document, generated
from the contract (:mod:`podbay.wire.openapi`). The data plane's is served
by the gateway at ``<endpoint>/openapi.json``."""

from __future__ import annotations

from functools import cache
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from podbay.wire.openapi import control_plane


@cache
def _document(base_url: str) -> dict[str, Any]:
    return control_plane(base_url)


async def openapi(request: Request) -> Response:
    return JSONResponse(_document(request.app.state.platform.base_url))


routes = [Route("/openapi.json", openapi, methods=["GET"])]
