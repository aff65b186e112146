"""Identity tokens: the JWT a deployment proves itself with.

Claims (DESIGN.md): ``sub`` = deployment id, ``iss`` = the control plane's
public URL (clients read it, unverified, to find the server), ``iat``,
``exp`` when the operator sets a lifetime. Signed EdDSA with the key ring's
active key, ``kid`` in the header.

A data-plane credential is also an EdDSA JWT, but carries an ``aud``;
PyJWT refuses a token with an ``aud`` when no audience is expected, so a
credential can never pass as an identity token.
"""

from __future__ import annotations

import time

from podbay.errors import ApiError
from podbay.signing import IDENTITY_TOKEN, SigningKeys, VerifyingKeys, sign, verify
from podbay.wire.codes import ErrorCode


def issue_identity_token(
    keys: SigningKeys, *, deployment_id: str, issuer: str, ttl_seconds: int = 0
) -> str:
    now = int(time.time())
    claims: dict[str, object] = {"sub": deployment_id, "iss": issuer, "iat": now}
    if ttl_seconds > 0:
        claims["exp"] = now + ttl_seconds
    return sign(keys, claims)


def verify_identity_token(keys: VerifyingKeys, token: str | None, *, issuer: str) -> str:
    """The deployment id a valid token names; otherwise ``IDENTITY_TOKEN_INVALID``.

    ``issuer`` is this control plane's public URL: a token naming another
    (an old URL, another installation sharing keys) is refused.
    """
    if not token:
        raise ApiError(
            ErrorCode.IDENTITY_TOKEN_INVALID,
            "an identity token is required (Authorization: Bearer <token>)",
        )
    claims = verify(keys, token, IDENTITY_TOKEN, require=["sub", "iat", "iss"], issuer=issuer)
    sub = claims.get("sub")
    if not isinstance(sub, str):
        raise IDENTITY_TOKEN.invalid()
    return sub


def bearer(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header."""
    if not authorization:
        return None
    scheme, _, value = authorization.partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        return None
    return value.strip()
