"""Data-plane credentials: short-lived, signed, scoped to one sandbox incarnation.

A compact EdDSA JWT: ``aud`` = ``podbay:data-plane``, ``sub`` = sandbox id,
``inc`` = incarnation, ``iat``, ``exp``, ``kid`` in the header. Chosen over
a smaller custom MAC because (1) a gateway on another machine verifies it
with the public key alone, never holding a key that could mint one, and
(2) it reuses the identity tokens' key ring and rotation. The cost of
Ed25519 verification is paid once per token: verified claims are
cached (bounded) and only ``exp`` is re-checked on a hit. The cache holds a
16-byte digest of each token, not the token (~340 bytes), so a full cache
costs about a third of what it did (the tokens were most of a soak's memory
growth while the cache filled).

>>> import tempfile, pathlib
>>> from podbay.control.keys import KeyRing
>>> ring = KeyRing.open(pathlib.Path(tempfile.mkdtemp()))
>>> token, _ = mint_credential(ring, sandbox_id="sb-1", incarnation=1, ttl_seconds=60)
>>> CredentialVerifier(ring).verify(token).sandbox_id
'sb-1'
"""

from __future__ import annotations

import hashlib
import sys
import time
from collections import OrderedDict
from dataclasses import dataclass
from datetime import datetime

from podbay.errors import ApiError
from podbay.signing import (
    CREDENTIAL,
    SHARE_URL,
    SigningKeys,
    VerifyingKeys,
    sign_expiring,
    verify,
)
from podbay.wire.codes import ErrorCode

AUDIENCE = "podbay:data-plane"
#: Share URLs' tokens: their own audience, so neither kind passes for the other.
SHARE_AUDIENCE = "podbay:port-share"
#: Longest life of a share URL.
MAX_SHARE_SECONDS = 7 * 24 * 3600


@dataclass(frozen=True)
class Share:
    sandbox_id: str
    port: int


def mint_share(
    keys: SigningKeys, *, sandbox_id: str, port: int, ttl_seconds: float
) -> tuple[str, datetime]:
    """A share token for one port of one sandbox (any incarnation), and when it expires."""
    claims = {"aud": SHARE_AUDIENCE, "sub": sandbox_id, "port": port}
    return sign_expiring(keys, claims, ttl_seconds)


def verify_share(keys: VerifyingKeys, token: str) -> Share:
    """What a share token grants; 401 ``CREDENTIAL_INVALID`` when forged or expired."""
    claims = verify(
        keys, token, SHARE_URL, require=["sub", "exp", "aud", "port"], audience=SHARE_AUDIENCE
    )
    sub, port = claims.get("sub"), claims.get("port")
    if (
        not isinstance(sub, str)
        or not isinstance(port, int)
        or isinstance(port, bool)
        or not 1 <= port <= 65535
    ):
        raise SHARE_URL.invalid()
    return Share(sub, port)


@dataclass(frozen=True, slots=True)
class Credential:
    sandbox_id: str
    incarnation: int
    expires: float  # unix seconds


def mint_credential(
    keys: SigningKeys, *, sandbox_id: str, incarnation: int, ttl_seconds: float
) -> tuple[str, datetime]:
    """A credential and when it expires."""
    claims = {"aud": AUDIENCE, "sub": sandbox_id, "inc": incarnation}
    return sign_expiring(keys, claims, ttl_seconds)


class CredentialVerifier:
    """Checks credentials locally: no call to the control plane per request."""

    def __init__(self, keys: VerifyingKeys, *, cache_size: int = 4096) -> None:
        self._keys = keys
        self._cache: OrderedDict[bytes, Credential] = OrderedDict()
        self._cache_size = cache_size

    @property
    def keys(self) -> VerifyingKeys:
        return self._keys

    def verify(self, token: str | None) -> Credential:
        if not token:
            raise ApiError(
                ErrorCode.CREDENTIAL_INVALID, "a sandbox credential is required; attach to get one"
            )
        key = _cache_key(token)
        cached = self._cache.get(key)
        if cached is not None:
            if cached.expires <= time.time():
                self._cache.pop(key, None)
                raise CREDENTIAL.expired()
            self._cache.move_to_end(key)
            return cached
        credential = self._verify_signature(token)
        self._keep(key, credential)
        return credential

    def remember(self, token: str, credential: Credential) -> None:
        """Cache a credential this process just minted (all-in-one), so the
        sandbox's first data-plane call skips the signature check. Only for
        tokens from :func:`mint_credential` here, never for received ones."""
        self._keep(_cache_key(token), credential)

    def cached(self) -> int:
        """How many verified credentials are cached (at most ``cache_size``)."""
        return len(self._cache)

    def _keep(self, key: bytes, credential: Credential) -> None:
        # One string per sandbox, not one per credential minted for it.
        credential = Credential(
            sys.intern(credential.sandbox_id), credential.incarnation, credential.expires
        )
        self._cache[key] = credential
        now = time.time()
        # Least recently used first: drop what is over the bound, and expired
        # entries while they lead (they would only be refused on a hit).
        while self._cache and (
            len(self._cache) > self._cache_size or next(iter(self._cache.values())).expires <= now
        ):
            self._cache.popitem(last=False)

    def _verify_signature(self, token: str) -> Credential:
        claims = verify(
            self._keys, token, CREDENTIAL, require=["sub", "exp", "aud"], audience=AUDIENCE
        )
        sub, inc = claims.get("sub"), claims.get("inc")
        if not isinstance(sub, str) or not isinstance(inc, int) or isinstance(inc, bool):
            raise CREDENTIAL.invalid()
        return Credential(sub, inc, float(claims["exp"]))


def _cache_key(token: str) -> bytes:
    """A token's cache key: 16 bytes of BLAKE2b, so a full cache is small and a
    token's bytes are held only while it is checked."""
    return hashlib.blake2b(token.encode(), digest_size=16).digest()
