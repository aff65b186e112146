from __future__ import annotations

import time

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from podbay.control import tokens
from podbay.control.keys import KeyRing, KeyRingError
from podbay.control.tokens import (
    IdentityTokens,
    bearer,
    issue_identity_token,
    verify_identity_token,
)
from podbay.dataplane.activity import ActivityTracker
from podbay.dataplane.credentials import AUDIENCE, Credential, CredentialVerifier, mint_credential
from podbay.errors import ApiError


@pytest.fixture
def ring(tmp_path) -> KeyRing:
    return KeyRing.open(tmp_path / "keys")


def _code(fn) -> str:  # type: ignore[no-untyped-def]
    with pytest.raises(ApiError) as info:
        fn()
    return info.value.code.value


def test_keys_stored_0600_in_a_0700_directory(ring, tmp_path):
    (path,) = (tmp_path / "keys").glob("*.pem")
    assert path.stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "keys").stat().st_mode & 0o777 == 0o700


def test_identity_token_claims(ring):
    token = issue_identity_token(ring, deployment_id="dep_1", issuer="http://x:1")
    claims = jwt.decode(token, options={"verify_signature": False})
    assert claims["sub"] == "dep_1"
    assert claims["iss"] == "http://x:1"
    assert "iat" in claims
    assert "exp" not in claims
    assert jwt.get_unverified_header(token)["alg"] == "EdDSA"
    assert verify_identity_token(ring, token, issuer="http://x:1") == "dep_1"
    with_exp = issue_identity_token(ring, deployment_id="d", issuer="i", ttl_seconds=60)
    assert "exp" in jwt.decode(with_exp, options={"verify_signature": False})


def _refused(ring, token):
    return _code(lambda: verify_identity_token(ring, token, issuer="i"))


def test_identity_token_refusals(ring):
    assert _refused(ring, None) == "IDENTITY_TOKEN_INVALID"
    assert _refused(ring, "garbage") == "IDENTITY_TOKEN_INVALID"
    key = ring.active()
    expired = jwt.encode(
        {"sub": "d", "iat": 1, "exp": int(time.time()) - 10},
        key.private,
        algorithm="EdDSA",
        headers={"kid": key.kid},
    )
    assert _refused(ring, expired) == "IDENTITY_TOKEN_INVALID"
    forged = jwt.encode(
        {"sub": "d", "iat": 1},
        Ed25519PrivateKey.generate(),
        algorithm="EdDSA",
        headers={"kid": ring.active().kid},
    )
    assert _refused(ring, forged) == "IDENTITY_TOKEN_INVALID"
    hs = jwt.encode(
        {"sub": "d", "iat": 1}, "s" * 32, algorithm="HS256", headers={"kid": ring.active().kid}
    )
    assert _refused(ring, hs) == "IDENTITY_TOKEN_INVALID"
    credential, _ = mint_credential(ring, sandbox_id="sb", incarnation=1, ttl_seconds=60)
    assert _refused(ring, credential) == "IDENTITY_TOKEN_INVALID"


def test_rotation_keeps_old_tokens_until_removed(ring, tmp_path):
    old = issue_identity_token(ring, deployment_id="d", issuer="i")
    old_kid = ring.active().kid
    new_kid = ring.rotate()
    assert new_kid > old_kid
    assert ring.active().kid == new_kid
    new = issue_identity_token(ring, deployment_id="d", issuer="i")
    assert jwt.get_unverified_header(new)["kid"] == new_kid
    # a second process (the server) sees both
    other = KeyRing.open(tmp_path / "keys")
    assert verify_identity_token(other, old, issuer="i") == "d"
    assert verify_identity_token(other, new, issuer="i") == "d"
    with pytest.raises(KeyRingError):
        ring.remove(new_kid)  # the active key stays
    ring.remove(old_kid)
    other.reload()
    assert _refused(other, old) == "IDENTITY_TOKEN_INVALID"
    assert verify_identity_token(other, new, issuer="i") == "d"


def test_a_verified_identity_token_is_remembered_until_its_key_is_removed(
    ring, tmp_path, monkeypatch
):
    """Checked in full once (signature, claims), then known by its digest; a
    key removed from the ring refuses what it signed, remembered or not."""
    checks: list[str] = []
    full = tokens.verify

    def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
        checks.append("full")
        return full(*args, **kwargs)

    monkeypatch.setattr(tokens, "verify", counted)
    old = issue_identity_token(ring, deployment_id="d", issuer="i")
    old_kid = ring.active().kid
    ring.rotate()
    server = IdentityTokens(KeyRing.open(tmp_path / "keys"), "i")
    assert server.verify(old) == "d"
    assert server.verify(old) == "d"
    assert checks == ["full"]
    assert _code(lambda: IdentityTokens(ring, "elsewhere").verify(old)) == "IDENTITY_TOKEN_INVALID"
    ring.remove(old_kid)
    assert isinstance(server.keys, KeyRing)
    server.keys.reload()
    assert _code(lambda: server.verify(old)) == "IDENTITY_TOKEN_INVALID"
    assert _code(lambda: server.verify(None)) == "IDENTITY_TOKEN_INVALID"


def test_server_ring_notices_a_key_added_by_the_cli(tmp_path):
    server = KeyRing.open(tmp_path / "keys")
    cli = KeyRing.open(tmp_path / "keys")
    cli.rotate()
    token = issue_identity_token(cli, deployment_id="d", issuer="i")
    assert verify_identity_token(server, token, issuer="i") == "d"


def test_credentials(ring):
    verifier = CredentialVerifier(ring)
    token, expires = mint_credential(ring, sandbox_id="sb-1", incarnation=3, ttl_seconds=60)
    cred = verifier.verify(token)
    assert (cred.sandbox_id, cred.incarnation) == ("sb-1", 3)
    assert abs(expires.timestamp() - (time.time() + 60)) < 2
    assert verifier.verify(token) == cred  # cached
    assert _code(lambda: verifier.verify(None)) == "CREDENTIAL_INVALID"
    assert _code(lambda: verifier.verify("x.y.z")) == "CREDENTIAL_INVALID"
    expired, _ = mint_credential(ring, sandbox_id="sb-1", incarnation=3, ttl_seconds=-1)
    assert _code(lambda: verifier.verify(expired)) == "CREDENTIAL_INVALID"
    identity = issue_identity_token(ring, deployment_id="d", issuer="i")
    assert _code(lambda: verifier.verify(identity)) == "CREDENTIAL_INVALID"
    forged = jwt.encode(
        {"aud": AUDIENCE, "sub": "sb-1", "inc": 3, "exp": time.time() + 60},
        Ed25519PrivateKey.generate(),
        algorithm="EdDSA",
        headers={"kid": ring.active().kid},
    )
    assert _code(lambda: verifier.verify(forged)) == "CREDENTIAL_INVALID"


def test_cached_credential_still_expires(ring, monkeypatch):
    verifier = CredentialVerifier(ring)
    token, _ = mint_credential(ring, sandbox_id="sb", incarnation=1, ttl_seconds=5)
    verifier.verify(token)
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + 10)
    assert _code(lambda: verifier.verify(token)) == "CREDENTIAL_INVALID"


def test_cache_is_bounded(ring):
    verifier = CredentialVerifier(ring, cache_size=3)
    for i in range(10):
        token, _ = mint_credential(ring, sandbox_id=f"sb-{i}", incarnation=1, ttl_seconds=60)
        verifier.verify(token)
    assert verifier.cached() == 3


def test_full_cache_stays_small(ring):
    """A soak attaches thousands of times: each attach's credential is cached
    until the bound pushes it out, so a full cache's size is the server's
    memory plateau. Measured with tracemalloc, per cached credential."""
    import tracemalloc

    size = 2000
    verifier = CredentialVerifier(ring, cache_size=size)
    token, _ = mint_credential(
        ring, sandbox_id="sb-0123456789abcdef", incarnation=1, ttl_seconds=600
    )
    expires = time.time() + 600
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(3 * size):
            # A new token each time (they differ in iat, exp and signature) and
            # a fresh sandbox id string, as read from a row.
            fresh = token[:-12] + f"{i:012d}"
            sandbox_id = "".join(["sb-0123456789", "abcdef"])
            verifier.remember(fresh, Credential(sandbox_id, 1 + i % 3, expires))
        held = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert verifier.cached() == size
    assert held / size < 300, f"{held / size:.0f} bytes per cached credential"
    # Expired entries leave as soon as they lead the cache.
    later = CredentialVerifier(ring, cache_size=size)
    later.remember(token + "a", Credential("sb-1", 1, time.time() - 1))
    later.remember(token + "b", Credential("sb-1", 1, expires))
    assert later.cached() == 1


def test_bearer():
    assert bearer("Bearer abc") == "abc"
    assert bearer("bearer  abc ") == "abc"
    assert bearer("Basic abc") is None
    assert bearer(None) is None
    assert bearer("Bearer ") is None


def test_activity_drain_and_restore():
    t = ActivityTracker()
    t.touch("a")
    seen = t.drain()
    assert set(seen) == {"a"}
    assert t.drain() == {}
    t.restore(seen)
    assert set(t.drain()) == {"a"}


def test_a_remembered_credential_is_taken_without_a_signature_check(ring):
    # What this process minted itself needs no check; anything else still gets one.
    from podbay.dataplane.credentials import Credential

    verifier = CredentialVerifier(ring)
    token, expires = mint_credential(ring, sandbox_id="sb-1", incarnation=3, ttl_seconds=60)
    forged = token[: token.rindex(".") + 1] + "AAAA"
    verifier.remember(forged, Credential("sb-1", 3, expires.timestamp()))
    assert verifier.verify(forged).incarnation == 3
    other = forged.replace("AAAA", "BBBB")
    assert _code(lambda: verifier.verify(other)) == "CREDENTIAL_INVALID"
