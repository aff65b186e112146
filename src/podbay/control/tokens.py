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

import hashlib
import time
from collections import OrderedDict
from typing import Any

import jwt

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
    return str(_identity_claims(keys, token, issuer)["sub"])


def _identity_claims(keys: VerifyingKeys, token: str | None, issuer: str) -> dict[str, Any]:
    if not token:
        raise ApiError(
            ErrorCode.IDENTITY_TOKEN_INVALID,
            "an identity token is required (Authorization: Bearer <token>)",
        )
    claims = verify(keys, token, IDENTITY_TOKEN, require=["sub", "iat", "iss"], issuer=issuer)
    if not isinstance(claims.get("sub"), str):
        raise IDENTITY_TOKEN.invalid()
    return claims


class IdentityTokens:
    """:func:`verify_identity_token` for one issuer, remembering the tokens it
    has verified (at most ``cache_size``, least recently used dropped).

    A full check is dear in CPU, most of it PyJWT validating the base64 of
    every segment character by character in Python (twice: header, then
    token), more than the Ed25519 signature; every
    control-plane call paid it for the same few tokens. A remembered token is
    checked again for what can change: its key still in the ring (a removed key
    refuses what it signed, as at once as before) and its ``exp``. Its digest
    is kept, not the token.
    """

    def __init__(self, keys: VerifyingKeys, issuer: str, *, cache_size: int = 1024) -> None:
        self.keys = keys
        self.issuer = issuer
        self.cache_size = cache_size
        #: digest → (signing key id, deployment id, exp or None)
        self._known: OrderedDict[bytes, tuple[str, str, float | None]] = OrderedDict()

    def verify(self, token: str | None) -> str:
        """The deployment id a valid token names; otherwise ``IDENTITY_TOKEN_INVALID``."""
        digest = hashlib.blake2b(token.encode(), digest_size=16).digest() if token else b""
        known = self._known.get(digest)
        if known is not None:
            kid, sub, exp = known
            if self.keys.public_key(kid) is not None and (exp is None or exp > time.time()):
                self._known.move_to_end(digest)
                return sub
            del self._known[digest]  # the full check below refuses it, as it should
        claims = _identity_claims(self.keys, token, self.issuer)
        assert token is not None  # refused above otherwise
        exp = claims.get("exp")
        self._known[digest] = (
            str(jwt.get_unverified_header(token)["kid"]),
            str(claims["sub"]),
            float(exp) if isinstance(exp, int | float) else None,
        )
        while len(self._known) > self.cache_size:
            self._known.popitem(last=False)
        return str(claims["sub"])


def bearer(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header."""
    if not authorization:
        return None
    scheme, _, value = authorization.partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        return None
    return value.strip()
