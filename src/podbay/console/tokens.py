"""Operator tokens and console sessions: two more kinds of signed token.

Both are EdDSA JWTs over the server's key ring, like identity tokens, each
with its own ``aud`` so that no kind passes for another (an identity token
has no ``aud``; PyJWT refuses a token without the audience asked for, and
refuses one with an ``aud`` when none is asked for).

An operator token (``podbay admin token``) carries ``gen``, the store's
operator generation when it was minted: ``podbay admin token --revoke-all``
bumps the generation, and every operator token and operator session minted
before stops working on every replica at its next check (the generation is
read from the store, at most :data:`GENERATION_CACHE_SECONDS` old).

A session (the console's cookie) names its scope, its deployment's id for a
deployment session, and a random CSRF token the page must echo in
``X-CSRF-Token``: the cookie is HttpOnly, so only a page of this origin that
asked ``GET /console/session`` knows it. Sessions are stateless (any control
replica checks them); signing out clears the cookie, and a session ends by
itself after :data:`SESSION_SECONDS`.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Literal

from podbay.errors import ApiError
from podbay.signing import SigningKeys, TokenKind, VerifyingKeys, sign, verify
from podbay.store.base import Store
from podbay.wire.codes import ErrorCode

OPERATOR_AUDIENCE = "podbay-operator"
SESSION_AUDIENCE = "podbay-console"
#: The store's meta key holding the operator generation (see the module's doc).
GENERATION_KEY = "console.operator_generation"
GENERATION_CACHE_SECONDS = 1.0
#: A console session's life: a working day, then the console asks to sign in again.
SESSION_SECONDS = 12 * 3600
#: ``podbay admin token``'s default lifetime.
OPERATOR_TOKEN_SECONDS = 30 * 24 * 3600

OPERATOR_TOKEN = TokenKind(ErrorCode.TOKEN_INVALID, "operator token")
SESSION = TokenKind(ErrorCode.SESSION_INVALID, "console session", renew="sign in again")

Scope = Literal["operator", "deployment"]


@dataclass(frozen=True)
class Session:
    scope: Scope
    #: The deployment's id for a deployment session; None for an operator's.
    deployment_id: str | None
    csrf: str
    expires_at: datetime


class Generation:
    """The store's operator generation, read at most once a second."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._value = 0
        self._read_at = -GENERATION_CACHE_SECONDS

    async def current(self) -> int:
        now = time.monotonic()
        if now - self._read_at >= GENERATION_CACHE_SECONDS:
            raw = await self.store.get_meta(GENERATION_KEY)
            self._value = int(raw) if raw and raw.isdigit() else 0
            self._read_at = now
        return self._value

    async def bump(self) -> int:
        """Revoke every operator token and session minted so far."""
        self._value = await self.current() + 1
        await self.store.set_meta(GENERATION_KEY, str(self._value))
        return self._value


def issue_operator_token(
    keys: SigningKeys, *, issuer: str, generation: int, ttl_seconds: int
) -> tuple[str, datetime | None]:
    """A new operator token and when it expires (None: never, ``ttl_seconds`` 0)."""
    now = int(time.time())
    claims: dict[str, object] = {
        "sub": "operator",
        "aud": OPERATOR_AUDIENCE,
        "iss": issuer,
        "iat": now,
        "gen": generation,
        "jti": secrets.token_hex(8),
    }
    expires = None
    if ttl_seconds > 0:
        claims["exp"] = now + ttl_seconds
        expires = datetime.fromtimestamp(now + ttl_seconds, UTC)
    return sign(keys, claims), expires


async def verify_operator_token(
    keys: VerifyingKeys, token: str, *, issuer: str, generation: Generation
) -> None:
    """Refuses (``TOKEN_INVALID``) a token that is not a current operator token."""
    claims = verify(
        keys,
        token,
        OPERATOR_TOKEN,
        require=["sub", "iat", "gen"],
        audience=OPERATOR_AUDIENCE,
        issuer=issuer,
    )
    if claims.get("gen") != await generation.current():
        raise ApiError(ErrorCode.TOKEN_INVALID, "the operator token was revoked")


def issue_session(
    keys: SigningKeys, *, issuer: str, scope: Scope, deployment_id: str | None, generation: int
) -> tuple[str, Session]:
    now = int(time.time())
    session = Session(
        scope=scope,
        deployment_id=deployment_id,
        csrf=secrets.token_urlsafe(24),
        expires_at=datetime.fromtimestamp(now + SESSION_SECONDS, UTC),
    )
    claims: dict[str, object] = {
        "sub": deployment_id or "operator",
        "scope": scope,
        "aud": SESSION_AUDIENCE,
        "iss": issuer,
        "iat": now,
        "exp": now + SESSION_SECONDS,
        "csrf": session.csrf,
        "gen": generation,
    }
    return sign(keys, claims), session


async def verify_session(
    keys: VerifyingKeys, token: str | None, *, issuer: str, generation: Generation
) -> Session:
    """The session a valid cookie holds; ``SESSION_INVALID`` otherwise."""
    if not token:
        raise ApiError(ErrorCode.SESSION_INVALID, "not signed in (no console session)")
    claims = verify(
        keys,
        token,
        SESSION,
        require=["sub", "scope", "exp", "csrf", "gen"],
        audience=SESSION_AUDIENCE,
        issuer=issuer,
    )
    scope, sub, csrf = claims["scope"], claims["sub"], claims["csrf"]
    if scope not in ("operator", "deployment") or not isinstance(sub, str):
        raise SESSION.invalid()
    if not isinstance(csrf, str) or not isinstance(claims["exp"], int):
        raise SESSION.invalid()
    if scope == "operator" and claims["gen"] != await generation.current():
        raise ApiError(ErrorCode.SESSION_INVALID, "the operator's sessions were revoked")
    return Session(
        scope=scope,
        deployment_id=sub if scope == "deployment" else None,
        csrf=csrf,
        expires_at=datetime.fromtimestamp(claims["exp"], UTC),
    )
