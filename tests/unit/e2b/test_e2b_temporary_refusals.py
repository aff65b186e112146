"""A temporary refusal stays one on E2B's surface: the data plane's 503 with
``Retry-After`` is waited out (bounded), the control plane's keeps its wait."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime

import httpx
import pytest

from podbay.control.services.sandboxes import Attached
from podbay.domain import SandboxState
from podbay.e2b import connect, relay
from podbay.e2b.error_responses import E2BError, on_api_error
from podbay.e2b.nodes import NodeE2BService
from podbay.errors import ApiError
from podbay.testing.records import sandbox_record
from podbay.wire.codes import ErrorCode

ENDPOINT = "http://node-1.invalid:8700/sandbox/sb"
TAKING_BACK = httpx.Response(
    503,
    json={"error": "the server is taking back its sandboxes", "code": "SANDBOXES_UNAVAILABLE"},
    headers={"Retry-After": "0"},
)


class _Service:
    """What :func:`relay.call` uses of the E2B service: its HTTP client."""

    def __init__(self, answers: list[httpx.Response]) -> None:
        self.asked = 0

        def answer(request: httpx.Request) -> httpx.Response:
            self.asked += 1
            return answers.pop(0) if len(answers) > 1 else answers[0]

        self.http = httpx.AsyncClient(transport=httpx.MockTransport(answer))


def _attached() -> Attached:
    row = sandbox_record("s", state=SandboxState.RUNNING, node="node-1")
    return Attached(row, "reused", "cred", datetime(2030, 1, 1, tzinfo=UTC), ENDPOINT)


def _call(service: _Service) -> httpx.Response:
    return asyncio.run(relay.call(service, _attached(), "GET", "/v1/processes"))  # type: ignore[arg-type]


def test_a_data_plane_taking_back_its_sandboxes_is_asked_again() -> None:
    # A node's gateway just restarted: it said when to ask again, and the call
    # was surfaced as "unavailable" at once.
    service = _Service([TAKING_BACK, TAKING_BACK, httpx.Response(200, json={"processes": []})])
    assert _call(service).json() == {"processes": []}
    assert service.asked == 3


def test_asking_again_is_bounded_and_the_refusal_says_to_retry() -> None:
    service = _Service([TAKING_BACK])
    with pytest.raises(connect.ConnectError) as caught:
        _call(service)
    assert caught.value.code == "unavailable"
    assert "retry in 0 s" in caught.value.message
    assert service.asked == relay.RETRIES + 1


def test_a_refusal_that_is_not_temporary_is_not_repeated() -> None:
    busy = httpx.Response(503, json={"error": "agent gone", "code": "AGENT_UNREACHABLE"})
    service = _Service([busy])
    with pytest.raises(connect.ConnectError):
        _call(service)
    assert service.asked == 1


def test_podbays_temporary_refusal_keeps_its_wait_in_e2bs_shape() -> None:
    exc = ApiError(ErrorCode.SANDBOXES_UNAVAILABLE, "no node is ready", retry_after=2)
    answer = asyncio.run(on_api_error(None, exc))  # type: ignore[arg-type]
    assert answer.status_code == 503
    assert answer.headers["retry-after"] == "2"
    assert answer.headers["should-retry"] == "true"
    assert json.loads(bytes(answer.body))["error_code"] == "SANDBOXES_UNAVAILABLE"


def test_a_node_passes_on_the_control_planes_wait() -> None:
    # The control plane refuses a reach in podbay's shape while its nodes start
    # (the wait in Retry-After): the node's E2B answer keeps it for the SDK.
    def refuse(request: httpx.Request) -> httpx.Response:
        body = {"error": "no node is ready to run sandboxes now", "code": "SANDBOXES_UNAVAILABLE"}
        return httpx.Response(503, json=body, headers={"Retry-After": "2"})

    async def reach() -> None:
        service = NodeE2BService("http://control.invalid", lambda: "node-credential")
        await service.http.aclose()
        service.http = httpx.AsyncClient(transport=httpx.MockTransport(refuse))
        try:
            await service.authorize("sb", "token", None)
        finally:
            await service.close()

    with pytest.raises(E2BError) as caught:
        asyncio.run(reach())
    assert caught.value.status == 503
    assert caught.value.code == "SANDBOXES_UNAVAILABLE"
    assert caught.value.retry_after == 2
