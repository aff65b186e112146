"""Both OpenAPI documents, served and fuzzed: schemathesis against a real
server with a real sandbox, bounded, and not one 5xx.

The documents come from the contract (``podbay.wire.openapi``); the server
serves them at ``/openapi.json`` (control plane) and
``<endpoint>/openapi.json`` (data plane). Hypothesis generates requests
from them (valid and invalid), each sent with a real identity token or
credential; every answer must be below 500 and match its documented schema.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import response_schema_conformance

from podbay.testing.platform import PlatformServer
from podbay.wire.openapi import control_plane, data_plane

# Alone: its last test counts what the fuzzing before it reached, which a
# second worker's run does not see whole (46 control cases of 50 under xdist).
pytestmark = [pytest.mark.root, pytest.mark.alone, pytest.mark.timeout(600)]

#: Examples per operation: about two minutes for both documents on 2 cores.
EXAMPLES = 30
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)
CHECKS = [not_a_server_error, response_schema_conformance]
#: Fuzzed commands get a short deadline: a generated argv may name a real
#: program that waits (the contract allows a day).
EXEC_DEADLINE_MS = 3000

#: (plane, method, path, status) of every fuzzed request, for the last test.
SEEN: list[tuple[str, str, str, int]] = []

control_schema = schemathesis.openapi.from_dict(control_plane("http://podbay.invalid"))
data_schema = schemathesis.openapi.from_dict(data_plane("/sandbox/placeholder"))


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PlatformServer]:
    with PlatformServer.start(
        tmp_path_factory.mktemp("serve"),
        env={
            "PODBAY_CAPS_PER_DEPLOYMENT": "4",
        },
    ) as s:
        yield s


@pytest.fixture(scope="module")
def token(server: PlatformServer) -> str:
    return server.create_deployment("fuzzed")


@pytest.fixture(scope="module")
def handle(server: PlatformServer) -> dict[str, Any]:
    # Its own deployment: the control-plane fuzzing deletes what it finds.
    r = server.attach(server.create_deployment("fuzzed-data"), "target")
    assert r.status_code == 200, r.text
    return dict(r.json())


def test_documents_are_served(server: PlatformServer, handle: dict[str, Any]) -> None:
    served = httpx.get(server.base_url + "/openapi.json").json()
    assert served == control_plane(server.base_url)
    served = httpx.get(handle["endpoint"] + "/openapi.json").json()
    assert served["openapi"] == "3.1.0"
    assert "/v1/exec" in served["paths"]


@control_schema.parametrize()
@FUZZ
def test_control_plane_fuzz(case: Any, server: PlatformServer, token: str) -> None:
    r = case.call_and_validate(
        base_url=server.base_url, checks=CHECKS, headers={"Authorization": f"Bearer {token}"}
    )
    SEEN.append(("control", case.method, case.path, r.status_code))


@data_schema.parametrize()
@FUZZ
def test_data_plane_fuzz(case: Any, server: PlatformServer, handle: dict[str, Any]) -> None:
    if case.path == "/v1/exec" and isinstance(case.body, dict):
        case.body["timeout_ms"] = EXEC_DEADLINE_MS
    r = case.call_and_validate(
        base_url=handle["endpoint"], checks=CHECKS, headers=dict(handle["headers"])
    )
    SEEN.append(("data", case.method, case.path, r.status_code))


def test_fuzzing_reached_both_planes() -> None:
    """Last: the cases above ran, got past authentication, and none was a 5xx."""
    by_plane = Counter(plane for plane, *_ in SEEN)
    statuses = Counter(status for *_, status in SEEN)
    print(f"\nschemathesis: {len(SEEN)} cases, {dict(by_plane)}, statuses {dict(statuses)}")
    assert by_plane["control"] >= 50
    assert by_plane["data"] >= 150
    for plane in ("control", "data"):
        assert any(200 <= s < 300 for p, _, _, s in SEEN if p == plane)
    assert not [case for case in SEEN if case[3] >= 500]
