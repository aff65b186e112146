"""``/console/session``: sign in with a token, see the session, sign out.

Sign-in takes an operator token (``podbay admin token``) or a deployment's
identity token, and answers with the session's document and its cookie:
HttpOnly (no script reads it), SameSite=Strict (no other site's request
carries it), Path=/ (the console's calls and the API's), Secure when the
server's public URL is https.
"""

from __future__ import annotations

import json
from typing import Any

from podbay.asgi import Receive, Scope, Send
from podbay.errors import ApiError
from podbay.wire.codes import ErrorCode
from podbay.wire.limits import MAX_JSON_BODY

from .guard import COOKIE, Guard, csrf_invalid, same_site
from .static import SECURITY_HEADERS
from .tokens import SESSION_SECONDS, Session, issue_session, verify_operator_token


async def send_json(
    send: Send, document: object, status: int = 200, *extra: tuple[bytes, bytes]
) -> None:
    body = json.dumps(document).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"cache-control", b"no-store"),
                *SECURITY_HEADERS,
                *extra,
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def read_body(receive: Receive, limit: int = MAX_JSON_BODY) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise ApiError(ErrorCode.REQUEST_TOO_LARGE, f"the body is over {limit} bytes")
        chunks.append(chunk)
        if not message.get("more_body"):
            break
    return b"".join(chunks)


def _cookie(value: str, max_age: int, secure: bool) -> tuple[bytes, bytes]:
    flags = f"; Max-Age={max_age}; Path=/; HttpOnly; SameSite=Strict" + (
        "; Secure" if secure else ""
    )
    return b"set-cookie", f"{COOKIE}={value}{flags}".encode()


async def _document(guard: Guard, session: Session) -> dict[str, Any]:
    name = None
    if session.deployment_id is not None:
        deployment = await guard.deployments.store.get_deployment(session.deployment_id)
        if deployment is None:
            raise ApiError(ErrorCode.SESSION_INVALID, "the session's deployment no longer exists")
        name = deployment.name
    return {
        "scope": session.scope,
        "deployment": name,
        "csrf": session.csrf,
        "expires_at": session.expires_at.strftime("%Y-%m-%dT%H:%M:%SZ"),
    }


async def _sign_in(guard: Guard, scope: Scope, receive: Receive, send: Send) -> None:
    # Sign-in sets the cookie: another site must not sign a visitor in (login CSRF).
    if not same_site(scope, guard.issuer):
        raise csrf_invalid("signing in from another site is refused")
    try:
        body = json.loads(await read_body(receive))
    except (ValueError, UnicodeDecodeError):
        raise ApiError(ErrorCode.REQUEST_INVALID, 'the body is JSON: {"token": "..."}') from None
    token = body.get("token") if isinstance(body, dict) else None
    if not isinstance(token, str) or not token.strip():
        raise ApiError(ErrorCode.REQUEST_INVALID, 'the body is JSON: {"token": "..."}')
    token = token.strip()
    generation = await guard.generation.current()
    try:
        await verify_operator_token(
            guard.keys, token, issuer=guard.issuer, generation=guard.generation
        )
        scope_name, deployment_id = "operator", None
    except ApiError as operator_refusal:
        try:
            deployment = await guard.deployments.authenticate(token)
        except ApiError:
            raise ApiError(
                ErrorCode.TOKEN_INVALID,
                "not an operator token (podbay admin token) nor a deployment's identity "
                f"token ({operator_refusal.message})",
            ) from None
        scope_name, deployment_id = "deployment", deployment.id
    cookie, session = issue_session(
        guard.keys,
        issuer=guard.issuer,
        scope=scope_name,  # type: ignore[arg-type]
        deployment_id=deployment_id,
        generation=generation,
    )
    secure = guard.issuer.startswith("https:")
    await send_json(
        send, await _document(guard, session), 200, _cookie(cookie, SESSION_SECONDS, secure)
    )


async def serve(guard: Guard, scope: Scope, receive: Receive, send: Send) -> None:
    """``/console/session``, by method."""
    method = scope["method"]
    if method == "POST":
        await _sign_in(guard, scope, receive, send)
    elif method == "GET":
        await send_json(send, await _document(guard, await guard.session(scope)))
    elif method == "DELETE":
        await guard.session(scope)  # a cross-site sign-out is refused too
        clear = _cookie("", 0, guard.issuer.startswith("https:"))
        await send({"type": "http.response.start", "status": 204, "headers": [clear]})
        await send({"type": "http.response.body", "body": b""})
    else:
        raise ApiError(ErrorCode.METHOD_NOT_ALLOWED, "use POST, GET or DELETE")
