"""Identity tokens: a lifetime the operator sets (on by default), and the
issuer checked. Before: tokens never expired and any ``iss`` (or none) passed.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator

import jwt
import pytest

from podbay.control.keys import KeyRing
from podbay.settings import CredentialSettings
from podbay.signing import sign
from podbay.testing.platform import PlatformServer

pytestmark = [pytest.mark.root, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PlatformServer]:
    with PlatformServer.start(tmp_path_factory.mktemp("serve")) as s:
        yield s


@pytest.fixture(scope="module")
def token(server: PlatformServer) -> str:
    return server.create_deployment("tokens")


def forged_with_the_servers_key(server: PlatformServer, token: str, **claims: object) -> str:
    """The server's own key signing chosen claims (what a leaked token's
    holder cannot do, but another installation sharing keys could)."""
    good = jwt.decode(token, options={"verify_signature": False})
    ring = KeyRing.open(server.data_dir / "keys")
    merged = {k: v for k, v in {**good, **claims}.items() if v is not None}
    return sign(ring, merged)


def test_a_valid_token_works(server: PlatformServer, token: str) -> None:
    assert server.api("GET", "/api/v1/sandboxes", token).status_code == 200


def test_token_for_another_issuer_is_refused(server: PlatformServer, token: str) -> None:
    other = forged_with_the_servers_key(server, token, iss="http://elsewhere.example:8700")
    r = server.api("GET", "/api/v1/sandboxes", other)
    assert (r.status_code, r.json()["code"]) == (401, "IDENTITY_TOKEN_INVALID")
    assert "another server" in r.json()["error"]


def test_token_without_issuer_is_refused(server: PlatformServer, token: str) -> None:
    bare = forged_with_the_servers_key(server, token, iss=None)
    assert "iss" not in jwt.decode(bare, options={"verify_signature": False})
    r = server.api("GET", "/api/v1/sandboxes", bare)
    assert (r.status_code, r.json()["code"]) == (401, "IDENTITY_TOKEN_INVALID")


def test_tokens_expire_by_default(token: str) -> None:
    claims = jwt.decode(token, options={"verify_signature": False})
    assert claims["exp"] - claims["iat"] == CredentialSettings().identity_ttl_seconds > 0


def test_operator_set_lifetime_is_enforced(server: PlatformServer) -> None:
    server.create_deployment("short-lived")
    short = subprocess.run(
        [
            sys.executable,
            "-m",
            "podbay.cli.main",
            "deployment",
            "token",
            "short-lived",
            "--data-dir",
            str(server.data_dir),
        ],
        env={**server.env, "PODBAY_CREDENTIALS_IDENTITY_TTL_SECONDS": "1"},
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.strip()
    claims = jwt.decode(short, options={"verify_signature": False})
    assert claims["exp"] - claims["iat"] == 1
    time.sleep(max(0.0, claims["exp"] + 1.5 - time.time()))
    r = server.api("GET", "/api/v1/sandboxes", short)
    assert (r.status_code, r.json()["code"]) == (401, "IDENTITY_TOKEN_INVALID")
    assert "expired" in r.json()["error"]
