"""``/api/v1/volumes``: a deployment's named persistent volumes (docs/volumes.md)."""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from podbay.domain import Deployment
from podbay.errors import ApiError
from podbay.wire.codec import WireError, dumps, loads
from podbay.wire.codes import ErrorCode
from podbay.wire.control import VolumeCreate, VolumeList
from podbay.wire.paths import VOLUMES

from ..tokens import bearer

JSON = "application/json"


def _json(model: object, status: int = 200) -> Response:
    return Response(dumps(model), status_code=status, media_type=JSON)


async def _deployment(request: Request) -> Deployment:
    deployment: Deployment = await request.app.state.platform.deployments.authenticate(
        bearer(request.headers.get("authorization"))
    )
    return deployment


async def create(request: Request) -> Response:
    platform = request.app.state.platform
    deployment = await _deployment(request)
    try:
        body = loads(VolumeCreate, await request.body())
    except WireError as exc:
        raise ApiError(ErrorCode.REQUEST_INVALID, f"invalid volume body: {exc}") from None
    return _json(await platform.volumes.create(deployment, body), 201)


async def list_all(request: Request) -> Response:
    platform = request.app.state.platform
    volumes = await platform.volumes.list(await _deployment(request))
    return _json(VolumeList(volumes=volumes))


async def get_one(request: Request) -> Response:
    platform = request.app.state.platform
    volume = await platform.volumes.get(await _deployment(request), request.path_params["name"])
    return _json(volume)


async def delete(request: Request) -> Response:
    platform = request.app.state.platform
    await platform.volumes.delete(await _deployment(request), request.path_params["name"])
    return Response(status_code=204)


routes = [
    Route(VOLUMES, list_all, methods=["GET"]),
    Route(VOLUMES, create, methods=["POST"]),
    Route(VOLUMES + "/{name}", get_one, methods=["GET"]),
    Route(VOLUMES + "/{name}", delete, methods=["DELETE"]),
]
