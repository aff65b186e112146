"""Refusal codes: every code has a status, and the special statuses hold."""

from __future__ import annotations

from podbay.errors import (
    ApiError,
    SandboxNotEnabledError,
    SandboxRequestError,
    request_error,
)
from podbay.wire.codes import NOT_ENABLED_CODES, STATUS, ErrorCode, error_body
from podbay.wire.limits import is_valid_sandbox_name


def test_every_code_has_a_status() -> None:
    assert set(STATUS) == set(ErrorCode)
    assert all(100 <= status < 600 for status in STATUS.values())


def test_contract_statuses() -> None:
    assert ErrorCode.SANDBOX_LIMIT_REACHED.status == 402
    assert ErrorCode.SANDBOX_NOT_FOUND.status == 404
    assert ErrorCode.SANDBOX_START_FAILED.status == 502
    assert ErrorCode.PROCESS_LIMIT_REACHED.status == 429
    assert ErrorCode.COMMAND_START_FAILED.status == 400
    # Clients re-attach on 401/403: only credential problems may use them.
    reattach = {c for c, s in STATUS.items() if s in (401, 403)}
    assert reattach == {
        ErrorCode.IDENTITY_TOKEN_INVALID,
        ErrorCode.CREDENTIAL_INVALID,
        ErrorCode.SANDBOX_NOT_RUNNING,
        ErrorCode.CREDENTIAL_WRONG_SANDBOX,
        # Answered only on /internal/v1 (control plane and nodes), never to a client.
        ErrorCode.NODE_CREDENTIAL_INVALID,
        # Answered only to the console (a session cookie) and the operator's
        # admin API, never to an SDK's identity-token call.
        ErrorCode.TOKEN_INVALID,
        ErrorCode.SESSION_INVALID,
        ErrorCode.CSRF_INVALID,
        ErrorCode.OPERATOR_REQUIRED,
        ErrorCode.DEPLOYMENT_FORBIDDEN,
    }


def test_error_body_and_api_error() -> None:
    assert error_body(ErrorCode.SANDBOX_NOT_FOUND, "no") == {
        "error": "no",
        "code": "SANDBOX_NOT_FOUND",
    }
    err = ApiError(ErrorCode.SANDBOX_CLASS_UNKNOWN, "only default")
    assert err.status == 409
    assert err.body()["code"] == "SANDBOX_CLASS_UNKNOWN"


def test_not_enabled_only_for_its_two_codes() -> None:
    for code in NOT_ENABLED_CODES:
        assert isinstance(request_error(409, "x", code), SandboxNotEnabledError)
    other = request_error(409, "x", "SANDBOX_CLASS_UNKNOWN")
    assert type(other) is SandboxRequestError
    assert type(request_error(404, "x", "SANDBOX_NOT_DECLARED")) is SandboxRequestError


def test_sandbox_names() -> None:
    good = ["a", "thread-42", "A.b_c:d-e", "0" * 128]
    bad = ["", "-a", ".a", "a/b", "a b", "a\n", "0" * 129, "é", "a\x00"]
    assert all(is_valid_sandbox_name(n) for n in good)
    assert not any(is_valid_sandbox_name(n) for n in bad)
