"""What every handler of the sandbox API shares: which sandbox a request
reaches (its headers), envd's user, podbay's refusals turned into Connect's
codes, and Connect's unary answers."""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import posixpath
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
from starlette.requests import Request
from starlette.responses import Response

from podbay.control.services.sandboxes import Attached
from podbay.wire.paths import CREDENTIAL_HEADER

from . import connect
from .error_responses import E2BError
from .service import E2BService

SANDBOX_ID_HEADER = "e2b-sandbox-id"
ACCESS_TOKEN_HEADER = "x-access-token"
#: A podbay refusal's HTTP status → Connect's code.
CODES = {
    400: "invalid_argument",
    401: "unauthenticated",
    403: "permission_denied",
    404: "not_found",
    409: "failed_precondition",
    429: "resource_exhausted",
}
#: podbay's codes that mean something else than their status's Connect code.
_BY_ERROR_CODE = {
    "PATH_EXISTS": "already_exists",
    "PATH_ACCESS_DENIED": "permission_denied",
    "PROCESS_NOT_FOUND": "not_found",
}


def service_of(request: Request) -> E2BService:
    service: E2BService = request.app.state.e2b
    return service


async def reach(request: Request) -> tuple[Attached, dict[str, str]]:
    """The sandbox's data plane and the env vars it was created with."""
    service = service_of(request)
    sandbox_id = request.headers.get(SANDBOX_ID_HEADER, "")
    deployment, row = await service.authorize(
        sandbox_id,
        request.headers.get(ACCESS_TOKEN_HEADER),
        request.headers.get("x-api-key"),
    )
    return await service.reach(deployment, sandbox_id, row), row.env_vars


#: envd's default account: the SDK (envd 0.4.0 and later) sends no user unless
#: the caller names one, and E2B's sandboxes then run as ``user``, whose home
#: is its default directory. Every podbay image has it (uid 1000).
DEFAULT_USER = "user"


def user_of(request: Request) -> str:
    """envd's user: ``Authorization: Basic base64("<user>:")``; absent: ``user``."""
    value = request.headers.get("authorization", "")
    scheme, _, encoded = value.partition(" ")
    if scheme.lower() != "basic" or not encoded:
        return DEFAULT_USER
    try:
        name = base64.b64decode(encoded, validate=True).decode().partition(":")[0]
    except (binascii.Error, UnicodeDecodeError):
        raise E2BError(400, "REQUEST_INVALID", "the Authorization header is not Basic") from None
    return name or DEFAULT_USER


def home_of(user: str) -> str | None:
    """The default directory of E2B's two accounts (envd's: the user's home)."""
    return {"root": "/root", DEFAULT_USER: "/home/" + DEFAULT_USER}.get(user)


def in_home(user: str, path: str) -> str:
    """envd resolves a relative path against the user's home."""
    home = home_of(user)
    return path if path.startswith("/") or home is None else posixpath.join(home, path)


def headers(attached: Attached) -> dict[str, str]:
    return {CREDENTIAL_HEADER: attached.credential}


def refusal(status: int, raw: bytes) -> connect.ConnectError:
    """A data-plane refusal (podbay's ``{"error", "code"}``) as a Connect error."""
    try:
        body = json.loads(raw)
        message, code = str(body.get("error")), str(body.get("code"))
    except (ValueError, AttributeError):
        message, code = raw.decode(errors="replace")[:500], ""
    return connect.ConnectError(_BY_ERROR_CODE.get(code, CODES.get(status, "unavailable")), message)


#: A data plane that answers 503 ``SANDBOXES_UNAVAILABLE`` with ``Retry-After``
#: (a restarted node's gateway still taking back its sandboxes: nothing reached
#: the sandbox, so the call may be sent again) is asked again after the wait it
#: names, as podbay's client does, at most this many times and this long in all.
RETRIES = 3
RETRY_SECONDS = 30.0


def retry_after(answer: httpx.Response) -> float | None:
    """The wait a temporary refusal of the data plane names, or None: the
    refusal stands (any other answer, or no ``Retry-After`` in seconds)."""
    if answer.status_code != 503:
        return None
    try:
        code = answer.json().get("code")
        wait = float(answer.headers.get("retry-after", ""))
    except (ValueError, AttributeError):
        return None
    return max(0.0, wait) if code == "SANDBOXES_UNAVAILABLE" else None


async def call(
    service: E2BService, attached: Attached, method: str, path: str, **kwargs: Any
) -> httpx.Response:
    """One data-plane call; a transport failure or a refusal is a ``ConnectError``
    (a temporary refusal once asked again within :data:`RETRIES` and
    :data:`RETRY_SECONDS`)."""
    deadline = time.monotonic() + RETRY_SECONDS
    for attempt in range(RETRIES + 1):
        try:
            answer = await service.http.request(
                method, attached.endpoint + path, headers=headers(attached), **kwargs
            )
        except httpx.HTTPError as exc:
            raise connect.ConnectError(
                "unavailable", f"the sandbox's data plane failed: {exc}"
            ) from None
        wait = retry_after(answer)
        if wait is None or attempt == RETRIES or time.monotonic() + wait > deadline:
            break
        await asyncio.sleep(wait)
    if answer.status_code >= 300:
        refused = refusal(answer.status_code, answer.content)
        if wait is None:
            raise refused
        # Still temporary: Connect's error has no Retry-After, its message says it.
        raise connect.ConnectError(
            refused.code, f"{refused.message} (asked {attempt + 1} times; retry in {wait:g} s)"
        )
    return answer


def stream_error(exc: connect.ConnectError) -> Response:
    return Response(connect.end_of_stream(exc), 200, media_type=connect.STREAM_JSON)


def unary_error(exc: connect.ConnectError) -> Response:
    return Response(
        json.dumps(exc.json()), connect.STATUS.get(exc.code, 400), media_type=connect.UNARY_JSON
    )


Unary = Callable[[Request, Attached, dict[str, Any]], Awaitable[dict[str, Any]]]


def unary(handler: Unary) -> Callable[[Request], Awaitable[Response]]:
    """A unary Connect RPC: the sandbox is reached first (refusals there are the
    proxy's plain HTTP answers, as E2B gives them), then the JSON message is
    parsed and the handler's answer or ``ConnectError`` is sent back."""

    async def endpoint(request: Request) -> Response:
        attached, _ = await reach(request)
        try:
            message = connect.parse_request(
                await request.body(), request.headers.get("content-type", "")
            )
            answer = await handler(request, attached, message)
        except connect.ConnectError as exc:
            return unary_error(exc)
        return Response(json.dumps(answer), media_type=connect.UNARY_JSON)

    return endpoint
