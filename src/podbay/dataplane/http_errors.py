"""The one place podbay errors become HTTP: ``{"error", "code"}`` with the
code's status. Anything unexpected is a 500 ``INTERNAL`` (logged with its
traceback, never shown to the caller)."""

from __future__ import annotations

import json
import logging

from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from podbay.errors import ApiError
from podbay.wire.codes import ErrorCode

log = logging.getLogger("podbay.http")


def error_response(exc: ApiError, request: Request) -> Response:
    platform = getattr(request.app.state, "platform", None)
    if platform is not None:
        platform.metrics.refused(exc.code.value)
    headers = None if exc.retry_after is None else {"Retry-After": f"{exc.retry_after:g}"}
    return Response(
        json.dumps(exc.body()),
        status_code=exc.status,
        media_type="application/json",
        headers=headers,
    )


async def on_api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return error_response(exc, request)


async def on_http_exception(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 405:
        api = ApiError(ErrorCode.METHOD_NOT_ALLOWED, "method not allowed here")
    elif exc.status_code == 404:
        api = ApiError(ErrorCode.ROUTE_NOT_FOUND, "no such route")
    else:
        api = ApiError(ErrorCode.REQUEST_INVALID, str(exc.detail))
    return error_response(api, request)


async def on_client_gone(request: Request, exc: Exception) -> Response:
    """The client hung up mid-body: nobody to answer, nothing to log."""
    return Response(status_code=499)


async def on_unexpected(request: Request, exc: Exception) -> Response:
    log.error("unhandled error", exc_info=exc)
    return error_response(ApiError(ErrorCode.INTERNAL, "internal error"), request)


handlers = {
    ApiError: on_api_error,
    HTTPException: on_http_exception,
    ClientDisconnect: on_client_gone,
    Exception: on_unexpected,
}
