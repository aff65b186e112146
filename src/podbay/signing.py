"""Signed tokens over a key ring: the one place tokens are signed and checked.

Identity tokens (control plane) and data-plane credentials (gateway) are
both compact JWTs, Ed25519-signed (``EdDSA``), the signing key's id in the
header: a verifier needs public keys only, and a rotated key keeps verifying
what it signed until it is removed. PyJWT's errors become the caller's
refusal here (:class:`TokenKind`), and nowhere else.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

import jwt
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from podbay.errors import ApiError
from podbay.wire.codes import ErrorCode

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


def sign_expiring(
    keys: SigningKeys, claims: Mapping[str, object], ttl_seconds: float
) -> tuple[str, datetime]:
    """``claims`` signed with ``iat`` now and ``exp`` ``ttl_seconds`` later; and that ``exp``."""
    now = time.time()
    exp = int(now + ttl_seconds)
    return sign(keys, {**claims, "iat": int(now), "exp": exp}), datetime.fromtimestamp(exp, UTC)


@dataclass(frozen=True)
class TokenKind:
    """How a kind of token is refused: its contract code and what to call it.

    >>> IDENTITY_TOKEN.expired().message
    'the identity token has expired'
    """

    code: ErrorCode
    name: str
    #: what the caller should do once it has expired, appended after "; "
    renew: str = ""

    def expired(self) -> ApiError:
        advice = f"; {self.renew}" if self.renew else ""
        return ApiError(self.code, f"the {self.name} has expired{advice}")

    def invalid(self) -> ApiError:
        return ApiError(self.code, f"the {self.name} is not valid")


IDENTITY_TOKEN = TokenKind(ErrorCode.IDENTITY_TOKEN_INVALID, "identity token")
CREDENTIAL = TokenKind(ErrorCode.CREDENTIAL_INVALID, "sandbox credential", renew="attach again")
SHARE_URL = TokenKind(ErrorCode.CREDENTIAL_INVALID, "share URL", renew="ask for a new one")


def verify(
    keys: VerifyingKeys,
    token: str,
    kind: TokenKind,
    *,
    require: Sequence[str],
    audience: str | None = None,
    issuer: str | None = None,
) -> dict[str, Any]:
    """The claims of ``token`` if one of ``keys`` signed it and it is in date.

    Otherwise ``kind``'s refusal (expired, or not valid). Without
    ``audience``, a token that names one is refused, so a credential never
    passes for an identity token. With ``issuer``, the ``iss`` claim must be it.
    """
    try:
        kid = jwt.get_unverified_header(token).get("kid")
        public = keys.public_key(kid) if isinstance(kid, str) else None
        if public is None:
            raise kind.invalid()
        claims: dict[str, Any] = jwt.decode(
            token,
            public,
            algorithms=[ALGORITHM],
            audience=audience,
            issuer=issuer,
            options={"require": list(require)},
        )
    except jwt.ExpiredSignatureError:
        raise kind.expired() from None
    except jwt.InvalidIssuerError:
        raise ApiError(
            kind.code, f"the {kind.name} was issued for another server (its iss is not {issuer})"
        ) from None
    except jwt.InvalidTokenError:
        raise kind.invalid() from None
    return claims
