"""The sandbox API (``E2B_SANDBOX_URL``): what E2B's SDKs ask of envd, the
daemon in an E2B sandbox, answered by relaying to the sandbox's agent through
podbay's data plane (its gateway, over HTTP with a minted credential, as any
podbay client reaches it).

Served: ``GET /health``; the process service on the agent's spawned
processes (``podbay.e2b.processes``: Start, Connect, List, SendInput,
StreamInput, CloseStdin, SendSignal, and Update for terminals:
``podbay.e2b.pty``); the filesystem service's Stat, ListDir, MakeDir, Move
and Remove (``podbay.e2b.filesystem``); ``GET /files`` (download) and
``POST /files`` (upload: ``podbay.e2b.files``); the watchers (WatchDir,
CreateWatcher, GetWatcherEvents, RemoveWatcher: ``podbay.e2b.watchers``).
Any other RPC answers Connect's ``unimplemented`` with a message naming it.
"""

from __future__ import annotations

import json

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from podbay.errors import ApiError

from . import connect, files, filesystem, processes, pty, watchers
from .error_responses import E2BError, error_response
from .relay import (
    ACCESS_TOKEN_HEADER,
    SANDBOX_ID_HEADER,
    service_of,
    stream_error,
)
from .service import E2BService


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
    Route("/process.Process/Update", processes.update, methods=["POST"]),
    Route("/process.Process/{method}", unimplemented_rpc, methods=["POST"]),
    Route("/filesystem.Filesystem/Stat", filesystem.stat_rpc, methods=["POST"]),
    Route("/filesystem.Filesystem/ListDir", filesystem.list_dir, methods=["POST"]),
    Route("/filesystem.Filesystem/MakeDir", filesystem.make_dir, methods=["POST"]),
    Route("/filesystem.Filesystem/Move", filesystem.move, methods=["POST"]),
    Route("/filesystem.Filesystem/Remove", filesystem.remove, methods=["POST"]),
    Route("/filesystem.Filesystem/WatchDir", watchers.watch_dir, methods=["POST"]),
    Route("/filesystem.Filesystem/CreateWatcher", watchers.create_watcher, methods=["POST"]),
    Route("/filesystem.Filesystem/GetWatcherEvents", watchers.get_watcher_events, methods=["POST"]),
    Route("/filesystem.Filesystem/RemoveWatcher", watchers.remove_watcher, methods=["POST"]),
    Route("/filesystem.Filesystem/{method}", unimplemented_rpc, methods=["POST"]),
    Route("/files", files.download, methods=["GET"]),
    Route("/files", files.upload, methods=["POST"]),
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
    app.state.terminals = terminals = pty.Terminals()
    service.closers.append(terminals.close)
    app.state.watchers = watching = watchers.Watchers()
    service.closers.append(watching.close)
    return app
