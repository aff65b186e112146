"""The sandbox API (``E2B_SANDBOX_URL``): what E2B's SDKs ask of envd, the
daemon in an E2B sandbox, answered by relaying to the sandbox's agent through
podbay's data plane (its gateway, over HTTP with a minted credential, as any
podbay client reaches it).

Served: ``GET /health``; the process service on the agent's spawned
processes (``podbay.e2b.processes``: Start, Connect, List, SendInput,
StreamInput, CloseStdin, SendSignal); the filesystem service's Stat,
ListDir, MakeDir, Move and Remove (``podbay.e2b.filesystem``); ``GET /files``
(download) and ``POST /files`` (multipart or octet-stream upload) on the
agent's native files API. Every other RPC (PTY's Update, the watchers)
answers Connect's ``unimplemented`` with a message naming it.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
from email.parser import BytesParser
from email.policy import HTTP

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from podbay.errors import ApiError
from podbay.wire.paths import (
    DIGEST_HEADER,
    FILES,
)

from . import connect, filesystem, processes
from .errors import E2BError, error_response
from .relay import (
    ACCESS_TOKEN_HEADER,
    SANDBOX_ID_HEADER,
    headers,
    reach,
    service_of,
    stream_error,
)
from .service import E2BService

#: Uploads are buffered whole here (multipart is parsed in memory).
MAX_UPLOAD = 256 * 1024 * 1024


async def health(request: Request) -> Response:
    """204 while the sandbox exists (killed or timed out: 502 "was not found")."""
    await service_of(request).authorize(
        request.headers.get(SANDBOX_ID_HEADER, ""),
        request.headers.get(ACCESS_TOKEN_HEADER),
        request.headers.get("x-api-key"),
    )
    return Response(status_code=204)


async def unimplemented_rpc(request: Request) -> Response:
    error = connect.ConnectError(
        "unimplemented", f"{request.url.path.strip('/')} is not implemented by podbay yet"
    )
    if request.headers.get("content-type", "").startswith(connect.STREAM_JSON):
        return stream_error(error)
    return Response(
        json.dumps(error.json()), connect.STATUS[error.code], media_type=connect.UNARY_JSON
    )


# -- /files ------------------------------------------------------------------------------
def _file_params(request: Request, path: str) -> dict[str, str]:
    params = {"path": path}
    user = request.query_params.get("username")
    if user:
        params["user"] = user
    return params


async def download(request: Request) -> Response:
    path = request.query_params.get("path")
    if not path:
        raise E2BError(400, "REQUEST_INVALID", "path is required")
    attached, _ = await reach(request)
    service = service_of(request)
    answer = await service.http.get(
        attached.endpoint + FILES, params=_file_params(request, path), headers=headers(attached)
    )
    if answer.status_code != 200:
        return _filesrefusal(answer)
    return Response(answer.content, media_type="application/octet-stream")


def _filesrefusal(answer: httpx.Response) -> Response:
    try:
        body = answer.json()
        message, code = str(body.get("error")), str(body.get("code"))
    except (ValueError, AttributeError):
        message, code = answer.text[:500], "SANDBOX_ERROR"
    return error_response(answer.status_code, code, message)


def _parts(content_type: str, raw: bytes, path: str | None) -> list[tuple[str, bytes]]:
    media = content_type.split(";", 1)[0].strip().lower()
    if media == "application/octet-stream":
        if not path:
            raise E2BError(400, "REQUEST_INVALID", "path is required")
        return [(path, raw)]
    if media != "multipart/form-data":
        raise E2BError(400, "REQUEST_INVALID", f"content type {media!r} is not an upload")
    message = BytesParser(policy=HTTP).parsebytes(
        b"Content-Type: " + content_type.encode("latin-1") + b"\r\n\r\n" + raw
    )
    files: list[tuple[str, bytes]] = []
    for part in message.iter_parts():
        name = part.get_filename() or path
        if not name:
            raise E2BError(400, "REQUEST_INVALID", "a file part names no path")
        data = part.get_payload(decode=True)
        files.append((name, data if isinstance(data, bytes) else b""))
    if len(files) > 1 and path:
        raise E2BError(400, "REQUEST_INVALID", "path names one file; several were sent")
    return files


async def upload(request: Request) -> Response:
    if request.headers.get("content-encoding"):
        raise E2BError(501, "E2B_NOT_IMPLEMENTED", "compressed uploads are not implemented yet")
    raw = await request.body()
    if len(raw) > MAX_UPLOAD:
        raise E2BError(413, "REQUEST_TOO_LARGE", f"uploads are at most {MAX_UPLOAD} bytes")
    files = _parts(request.headers.get("content-type", ""), raw, request.query_params.get("path"))
    attached, _ = await reach(request)
    service = service_of(request)
    written = []
    for path, data in files:
        answer = await service.http.put(
            attached.endpoint + FILES,
            params=_file_params(request, path),
            content=data,
            headers={**headers(attached), DIGEST_HEADER: hashlib.sha256(data).hexdigest()},
        )
        if answer.status_code != 200:
            return _filesrefusal(answer)
        written.append({"name": posixpath.basename(path), "type": "file", "path": path})
    return Response(json.dumps(written), media_type="application/json")


async def not_served(request: Request) -> Response:
    raise E2BError(
        501, "E2B_NOT_IMPLEMENTED", f"{request.method} {request.url.path} is not implemented yet"
    )


routes = [
    Route("/health", health, methods=["GET"]),
    Route("/process.Process/Start", processes.start, methods=["POST"]),
    Route("/process.Process/Connect", processes.connect_rpc, methods=["POST"]),
    Route("/process.Process/List", processes.list_rpc, methods=["POST"]),
    Route("/process.Process/SendSignal", processes.send_signal, methods=["POST"]),
    Route("/process.Process/SendInput", processes.send_input, methods=["POST"]),
    Route("/process.Process/StreamInput", processes.stream_input, methods=["POST"]),
    Route("/process.Process/CloseStdin", processes.close_stdin, methods=["POST"]),
    Route("/process.Process/{method}", unimplemented_rpc, methods=["POST"]),
    Route("/filesystem.Filesystem/Stat", filesystem.stat_rpc, methods=["POST"]),
    Route("/filesystem.Filesystem/ListDir", filesystem.list_dir, methods=["POST"]),
    Route("/filesystem.Filesystem/MakeDir", filesystem.make_dir, methods=["POST"]),
    Route("/filesystem.Filesystem/Move", filesystem.move, methods=["POST"]),
    Route("/filesystem.Filesystem/Remove", filesystem.remove, methods=["POST"]),
    Route("/filesystem.Filesystem/{method}", unimplemented_rpc, methods=["POST"]),
    Route("/files", download, methods=["GET"]),
    Route("/files", upload, methods=["POST"]),
    Route("/{rest:path}", not_served, methods=["GET", "POST", "PUT", "PATCH", "DELETE"]),
]


async def on_e2b_error(_: Request, exc: Exception) -> Response:
    """E2B's proxy answers a sandbox that is gone 502 "... was not found": what
    the SDK reads as not running (``is_running()`` False, SandboxNotRunning)."""
    assert isinstance(exc, E2BError)
    status = 502 if exc.code == "SANDBOX_NOT_FOUND" else exc.status
    return error_response(status, exc.code, exc.message)


async def on_api_error(_: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return error_response(exc.status, exc.code.value, exc.message)


def build(service: E2BService) -> Starlette:
    handlers = {E2BError: on_e2b_error, ApiError: on_api_error}
    app = Starlette(routes=routes, exception_handlers=handlers)
    app.state.e2b = service
    app.state.processes = registry = processes.Registry()
    service.closers.append(registry.close)
    return app
