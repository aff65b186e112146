"""The sandbox API (``E2B_SANDBOX_URL``): what E2B's SDKs ask of envd, the
daemon in an E2B sandbox, answered by relaying to the sandbox's agent through
podbay's data plane (its gateway, over HTTP with a minted credential, as any
podbay client reaches it).

Served: ``GET /health``; ``process.Process/Start`` (a server stream: start,
output as it is written, end with the exit code), on the agent's streamed
exec; ``GET /files`` (download) and ``POST /files`` (multipart or
octet-stream upload) on the agent's native files API. Every other RPC answers
Connect's ``unimplemented`` with a message naming it.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import itertools
import json
import posixpath
from collections.abc import AsyncIterator
from email.parser import BytesParser
from email.policy import HTTP
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from podbay.control.services.sandboxes import Attached
from podbay.errors import ApiError
from podbay.wire.paths import (
    CREDENTIAL_HEADER,
    DIGEST_HEADER,
    EXEC,
    EXEC_STREAM_CONTENT_TYPE,
    FILES,
)

from . import connect
from .errors import E2BError, error_response
from .service import E2BService

SANDBOX_ID_HEADER = "e2b-sandbox-id"
ACCESS_TOKEN_HEADER = "x-access-token"
#: Uploads are buffered whole here (multipart is parsed in memory).
MAX_UPLOAD = 256 * 1024 * 1024
#: A podbay refusal's HTTP status → Connect's code.
_CODES = {
    400: "invalid_argument",
    401: "unauthenticated",
    403: "permission_denied",
    404: "not_found",
    409: "failed_precondition",
    429: "resource_exhausted",
}
_pids = itertools.count(1)


def _service(request: Request) -> E2BService:
    service: E2BService = request.app.state.e2b
    return service


async def _reach(request: Request) -> tuple[Attached, dict[str, str]]:
    """The sandbox's data plane and the env vars it was created with."""
    service = _service(request)
    sandbox_id = request.headers.get(SANDBOX_ID_HEADER, "")
    deployment, row = await service.authorize(
        sandbox_id,
        request.headers.get(ACCESS_TOKEN_HEADER),
        request.headers.get("x-api-key"),
    )
    return await service.reach(deployment, sandbox_id), row.env_vars


def _user(request: Request) -> str | None:
    """envd's user: ``Authorization: Basic base64("<user>:")``; absent: the default."""
    value = request.headers.get("authorization", "")
    scheme, _, encoded = value.partition(" ")
    if scheme.lower() != "basic" or not encoded:
        return None
    try:
        name = base64.b64decode(encoded, validate=True).decode().partition(":")[0]
    except (binascii.Error, UnicodeDecodeError):
        raise E2BError(400, "REQUEST_INVALID", "the Authorization header is not Basic") from None
    return name or None


def _headers(attached: Attached) -> dict[str, str]:
    return {CREDENTIAL_HEADER: attached.credential}


async def health(request: Request) -> Response:
    """204 while the sandbox exists (killed or timed out: 502 "was not found")."""
    await _service(request).authorize(
        request.headers.get(SANDBOX_ID_HEADER, ""),
        request.headers.get(ACCESS_TOKEN_HEADER),
        request.headers.get("x-api-key"),
    )
    return Response(status_code=204)


# -- process.Process/Start ------------------------------------------------------------
def _exec_body(
    message: dict[str, Any], env_vars: dict[str, str], request: Request
) -> dict[str, Any]:
    process = message.get("process")
    if not isinstance(process, dict) or not isinstance(process.get("cmd"), str):
        raise connect.ConnectError("invalid_argument", "process.cmd is required")
    args = process.get("args") or []
    envs = process.get("envs") or {}
    if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
        raise connect.ConnectError("invalid_argument", "process.args must be strings")
    if not isinstance(envs, dict) or not all(isinstance(v, str) for v in envs.values()):
        raise connect.ConnectError("invalid_argument", "process.envs must be strings")
    if message.get("pty"):
        raise connect.ConnectError("unimplemented", "PTY commands are not implemented yet")
    body: dict[str, Any] = {
        "command": [process["cmd"], *args],
        "env": {**env_vars, **envs},
        "output_encoding": "base64",
    }
    if isinstance(process.get("cwd"), str) and process["cwd"]:
        body["cwd"] = process["cwd"]
    user = _user(request)
    if user is not None:
        body["user"] = user
    deadline = connect.timeout_ms(request.headers.get("connect-timeout-ms"))
    if deadline is not None:
        body["timeout_ms"] = deadline
    return body


def _event(event: dict[str, Any]) -> bytes:
    return connect.envelope({"event": event})


async def _run(
    service: E2BService, attached: Attached, body: dict[str, Any]
) -> AsyncIterator[bytes]:
    yield _event({"start": {"pid": next(_pids)}})
    try:
        async with service.http.stream(
            "POST",
            attached.endpoint + EXEC,
            json=body,
            headers={**_headers(attached), "Accept": EXEC_STREAM_CONTENT_TYPE},
        ) as answer:
            if answer.status_code != 200:
                raise _refusal(answer.status_code, await answer.aread())
            result: dict[str, Any] | None = None
            async for line in answer.aiter_lines():
                if not line.strip():
                    continue
                item = json.loads(line)
                for stream in ("stdout", "stderr"):
                    if item.get(stream):
                        yield _event({"data": {stream: item[stream]}})
                if isinstance(item.get("result"), dict):
                    result = item["result"]
            if result is None:
                raise connect.ConnectError("unavailable", "the command's stream ended early")
            for stream in ("stdout", "stderr"):
                if result.get(stream):
                    yield _event({"data": {stream: result[stream]}})
            if result.get("timed_out"):
                raise connect.ConnectError("deadline_exceeded", "the command ran past its timeout")
            code = int(result["exit_code"])
            yield _event(
                {"end": {"exitCode": code, "exited": True, "status": f"exit status {code}"}}
            )
        yield connect.end_of_stream()
    except connect.ConnectError as exc:
        yield connect.end_of_stream(exc)
    except httpx.HTTPError as exc:
        yield connect.end_of_stream(
            connect.ConnectError("unavailable", f"the sandbox's data plane failed: {exc}")
        )


def _refusal(status: int, raw: bytes) -> connect.ConnectError:
    try:
        message = str(json.loads(raw).get("error"))
    except (ValueError, AttributeError):
        message = raw.decode(errors="replace")[:500]
    return connect.ConnectError(_CODES.get(status, "unavailable"), message)


async def start(request: Request) -> Response:
    # Refusals before the stream (credentials, no such sandbox) are plain HTTP
    # answers, as E2B's proxy in front of envd gives them.
    attached, env_vars = await _reach(request)
    try:
        message = connect.parse_request(
            await request.body(), request.headers.get("content-type", "")
        )
        body = _exec_body(message, env_vars, request)
    except connect.ConnectError as exc:
        return _stream_error(exc)
    return StreamingResponse(
        _run(_service(request), attached, body), media_type=connect.STREAM_JSON
    )


def _stream_error(exc: connect.ConnectError) -> Response:
    return Response(connect.end_of_stream(exc), 200, media_type=connect.STREAM_JSON)


async def unimplemented_rpc(request: Request) -> Response:
    error = connect.ConnectError(
        "unimplemented", f"{request.url.path.strip('/')} is not implemented by podbay yet"
    )
    if request.headers.get("content-type", "").startswith(connect.STREAM_JSON):
        return _stream_error(error)
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
    attached, _ = await _reach(request)
    service = _service(request)
    answer = await service.http.get(
        attached.endpoint + FILES, params=_file_params(request, path), headers=_headers(attached)
    )
    if answer.status_code != 200:
        return _files_refusal(answer)
    return Response(answer.content, media_type="application/octet-stream")


def _files_refusal(answer: httpx.Response) -> Response:
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
    attached, _ = await _reach(request)
    service = _service(request)
    written = []
    for path, data in files:
        answer = await service.http.put(
            attached.endpoint + FILES,
            params=_file_params(request, path),
            content=data,
            headers={**_headers(attached), DIGEST_HEADER: hashlib.sha256(data).hexdigest()},
        )
        if answer.status_code != 200:
            return _files_refusal(answer)
        written.append({"name": posixpath.basename(path), "type": "file", "path": path})
    return Response(json.dumps(written), media_type="application/json")


async def not_served(request: Request) -> Response:
    raise E2BError(
        501, "E2B_NOT_IMPLEMENTED", f"{request.method} {request.url.path} is not implemented yet"
    )


routes = [
    Route("/health", health, methods=["GET"]),
    Route("/process.Process/Start", start, methods=["POST"]),
    Route("/process.Process/{method}", unimplemented_rpc, methods=["POST"]),
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
    return app
