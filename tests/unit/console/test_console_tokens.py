"""Operator tokens and console sessions: no kind of token passes for another
(identity tokens, data-plane credentials), and expiry, another issuer and
``podbay admin token --revoke-all`` refuse them with their codes."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from podbay.console.tokens import (
    Generation,
    issue_operator_token,
    issue_session,
    verify_operator_token,
    verify_session,
)
from podbay.control.keys import KeyRing
from podbay.control.tokens import issue_identity_token, verify_identity_token
from podbay.dataplane.credentials import mint_credential
from podbay.errors import ApiError
from podbay.signing import sign
from podbay.store.sqlite import SqliteStore
from podbay.wire.codes import ErrorCode

pytestmark = pytest.mark.anyio
ISSUER = "http://127.0.0.1:8700"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def keys(tmp_path: Path) -> KeyRing:
    return KeyRing.open(tmp_path / "keys")


@pytest.fixture
async def generation(tmp_path: Path) -> AsyncIterator[Generation]:
    store = SqliteStore.open(tmp_path / "podbay.db")
    yield Generation(store)
    await store.close()


async def _code(check: object) -> ErrorCode:
    with pytest.raises(ApiError) as refused:
        await check  # type: ignore[misc]
    return refused.value.code


async def test_no_kind_of_token_passes_for_another(keys: KeyRing, generation: Generation) -> None:
    operator, _ = issue_operator_token(keys, issuer=ISSUER, generation=0, ttl_seconds=60)
    identity = issue_identity_token(keys, deployment_id="dep_x", issuer=ISSUER)
    session, _ = issue_session(
        keys, issuer=ISSUER, scope="operator", deployment_id=None, generation=0
    )
    credential, _ = mint_credential(keys, sandbox_id="sb_x", incarnation=1, ttl_seconds=60)
    for token in (identity, session, credential, "garbage"):
        check = verify_operator_token(keys, token, issuer=ISSUER, generation=generation)
        assert await _code(check) == ErrorCode.TOKEN_INVALID
    for token in (operator, identity, credential, "garbage"):
        check = verify_session(keys, token, issuer=ISSUER, generation=generation)
        assert await _code(check) == ErrorCode.SESSION_INVALID
    for token in (operator, session):
        with pytest.raises(ApiError) as refused:
            verify_identity_token(keys, token, issuer=ISSUER)
        assert refused.value.code == ErrorCode.IDENTITY_TOKEN_INVALID
    # Each is its own kind.
    await verify_operator_token(keys, operator, issuer=ISSUER, generation=generation)
    checked = await verify_session(keys, session, issuer=ISSUER, generation=generation)
    assert checked.scope == "operator"
    assert checked.deployment_id is None


async def test_expired_foreign_and_revoked(keys: KeyRing, generation: Generation) -> None:
    now = int(time.time())
    expired = sign(
        keys,
        {
            "sub": "operator",
            "scope": "operator",
            "aud": "podbay-console",
            "iss": ISSUER,
            "iat": now - 100,
            "exp": now - 10,
            "csrf": "x",
            "gen": 0,
        },
    )
    check = verify_session(keys, expired, issuer=ISSUER, generation=generation)
    assert await _code(check) == ErrorCode.SESSION_INVALID
    foreign, _ = issue_operator_token(keys, issuer="http://elsewhere", generation=0, ttl_seconds=60)
    check = verify_operator_token(keys, foreign, issuer=ISSUER, generation=generation)
    assert await _code(check) == ErrorCode.TOKEN_INVALID
    # --revoke-all: operator tokens and sessions minted before stop; a deployment's
    # session does not (its deployment's deletion ends it).
    operator, _ = issue_operator_token(keys, issuer=ISSUER, generation=0, ttl_seconds=0)
    op_session, _ = issue_session(
        keys, issuer=ISSUER, scope="operator", deployment_id=None, generation=0
    )
    dep_session, _ = issue_session(
        keys, issuer=ISSUER, scope="deployment", deployment_id="dep_x", generation=0
    )
    assert await generation.bump() == 1
    check = verify_operator_token(keys, operator, issuer=ISSUER, generation=generation)
    assert await _code(check) == ErrorCode.TOKEN_INVALID
    check = verify_session(keys, op_session, issuer=ISSUER, generation=generation)
    assert await _code(check) == ErrorCode.SESSION_INVALID
    kept = await verify_session(keys, dep_session, issuer=ISSUER, generation=generation)
    assert kept.deployment_id == "dep_x"
    fresh, _ = issue_operator_token(keys, issuer=ISSUER, generation=1, ttl_seconds=60)
    await verify_operator_token(keys, fresh, issuer=ISSUER, generation=generation)
