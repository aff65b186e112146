"""E2B's error shape: ``{"code": <HTTP status>, "message": ...}`` (its OpenAPI
``Error``), with podbay's UPPER_SNAKE code as ``error_code`` (a field E2B's
model has too)."""

from __future__ import annotations

import json
import math

from starlette.requests import Request
from starlette.responses import Response

from podbay.errors import ApiError, E2BError

__all__ = [
    "E2BError",
    "error_body",
    "error_response",
    "handlers",
    "not_implemented",
]


def error_body(status: int, code: str, message: str) -> bytes:
    return json.dumps({"code": status, "message": message, "error_code": code}).encode()


def error_response(
    status: int, code: str, message: str, headers: dict[str, str] | None = None
) -> Response:
    return Response(
        error_body(status, code, message), status, media_type="application/json", headers=headers
    )


def not_implemented(what: str) -> E2BError:
    return E2BError(501, "E2B_NOT_IMPLEMENTED", f"{what} is not implemented by podbay yet")


def _retrying(retry_after: float | None) -> dict[str, str] | None:
    if retry_after is None:
        return None
    # The SDK's retrying transport waits that long and asks again, within the
    # call's request timeout.
    return {"Retry-After": str(math.ceil(retry_after)), "Should-Retry": "true"}


async def on_e2b_error(_: Request, exc: Exception) -> Response:
    assert isinstance(exc, E2BError)
    return error_response(exc.status, exc.code, exc.message, _retrying(exc.retry_after))


async def on_api_error(_: Request, exc: Exception) -> Response:
    """podbay's own refusals (caps, environment, runtime) in E2B's shape; a
    temporary one (no node ready yet) keeps its ``Retry-After``."""
    assert isinstance(exc, ApiError)
    return error_response(exc.status, exc.code.value, exc.message, _retrying(exc.retry_after))


handlers = {E2BError: on_e2b_error, ApiError: on_api_error}
