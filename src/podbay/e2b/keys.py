"""E2B API keys and sandbox access tokens.

A key is ``e2b_`` + 40 hex digits, the format E2B's SDKs and tools expect; the
store keeps its SHA-256 only (a key has 160 random bits, so a plain digest is
enough: nothing to guess). An access token (E2B's ``envdAccessToken``) is an
HMAC of the sandbox id under a secret kept in the store's meta table, so every
control replica derives the same token and nothing per sandbox is stored.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
import secrets

KEY_PREFIX = "e2b_"
KEY_PATTERN = re.compile(r"^e2b_[0-9a-f]{40}$")
#: The meta key of the access-token secret.
SECRET_META_KEY = "e2b.access_secret"


def new_api_key() -> str:
    return KEY_PREFIX + secrets.token_hex(20)


def key_hash(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def new_secret() -> str:
    return secrets.token_hex(32)


def access_token(secret: str, sandbox_id: str) -> str:
    return hmac.new(bytes.fromhex(secret), sandbox_id.encode(), hashlib.sha256).hexdigest()


def token_matches(secret: str, sandbox_id: str, offered: str | None) -> bool:
    return offered is not None and hmac.compare_digest(access_token(secret, sandbox_id), offered)


def file_signature(
    path: str, operation: str, username: str, token: str, expiration: int | None
) -> str:
    """The SDK's v1 signature of a file URL (``e2b.sandbox.signature``):
    ``"v1_" + base64(sha256("<path>:<operation>:<username>:<token>[:<expiration>]"))``,
    unpadded."""
    raw = f"{path}:{operation}:{username}:{token}"
    if expiration is not None:
        raw += f":{expiration}"
    digest = hashlib.sha256(raw.encode()).digest()
    return "v1_" + base64.b64encode(digest).rstrip(b"=").decode("ascii")
