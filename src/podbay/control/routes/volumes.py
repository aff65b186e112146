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


def _path(request: Request) -> str:
    path = request.query_params.get("path")
    if path is None:
        raise ApiError(ErrorCode.VOLUME_PATH_INVALID, "name the file with ?path=")
    return path


async def read_file(request: Request) -> Response:
    platform = request.app.state.platform
    body = await platform.volumes.read_file(
        await _deployment(request), request.path_params["name"], _path(request)
    )
    return Response(body, media_type="application/octet-stream")


async def write_file(request: Request) -> Response:
    """The body, as the file's whole content (its directories made)."""
    platform = request.app.state.platform
    deployment = await _deployment(request)
    await platform.volumes.write_file(
        deployment, request.path_params["name"], _path(request), await request.body()
    )
    return Response(status_code=204)


async def delete_path(request: Request) -> Response:
    platform = request.app.state.platform
    await platform.volumes.delete_path(
        await _deployment(request), request.path_params["name"], _path(request)
    )
    return Response(status_code=204)


async def list_dir(request: Request) -> Response:
    platform = request.app.state.platform
    listing = await platform.volumes.list_dir(
        await _deployment(request),
        request.path_params["name"],
        request.query_params.get("path", ""),
    )
    return _json(listing)


routes = [
    Route(VOLUMES, list_all, methods=["GET"]),
    Route(VOLUMES, create, methods=["POST"]),
    Route(VOLUMES + "/{name}", get_one, methods=["GET"]),
    Route(VOLUMES + "/{name}", delete, methods=["DELETE"]),
    Route(VOLUMES + "/{name}/files", read_file, methods=["GET"]),
    Route(VOLUMES + "/{name}/files", write_file, methods=["PUT"]),
    Route(VOLUMES + "/{name}/files", delete_path, methods=["DELETE"]),
    Route(VOLUMES + "/{name}/entries", list_dir, methods=["GET"]),
]
