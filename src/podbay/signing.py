"""Signed tokens over a key ring: the one place tokens are signed and checked.

Identity tokens (control plane) and data-plane credentials (gateway) are
both compact JWTs, Ed25519-signed (``EdDSA``), the signing key's id in the
header: a verifier needs public keys only, and a rotated key keeps verifying
what it signed until it is removed. Callers turn the ``jwt`` errors into
their own refusals.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import jwt
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

ALGORITHM = "EdDSA"


class Signer(Protocol):
    @property
    def kid(self) -> str: ...

    @property
    def private(self) -> Ed25519PrivateKey: ...


class SigningKeys(Protocol):
    def active(self) -> Signer: ...


class VerifyingKeys(Protocol):
    def public_key(self, kid: str) -> Ed25519PublicKey | None: ...


def sign(keys: SigningKeys, claims: Mapping[str, Any]) -> str:
    """``claims`` signed with the active key."""
    key = keys.active()
    return jwt.encode(dict(claims), key.private, algorithm=ALGORITHM, headers={"kid": key.kid})


def verify(keys: VerifyingKeys, token: str, *, require: Sequence[str],
           audience: str | None = None) -> dict[str, Any]:
    """The claims of ``token`` if one of ``keys`` signed it and it is in date.

    Raises ``jwt.ExpiredSignatureError`` when expired and another
    ``jwt.InvalidTokenError`` otherwise. Without ``audience``, a token that
    names one is refused, so a credential never passes for an identity token.
    """
    kid = jwt.get_unverified_header(token).get("kid")
    public = keys.public_key(kid) if isinstance(kid, str) else None
    if public is None:
        raise jwt.InvalidTokenError("unknown signing key")
    claims: dict[str, Any] = jwt.decode(token, public, algorithms=[ALGORITHM],
                                        audience=audience, options={"require": list(require)})
    return claims
