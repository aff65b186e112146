"""Deleting a deployment stops its sandboxes' credentials at once, not at
the next lifecycle pass (which here is an hour away)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from podbay.testing.platform import PlatformServer

pytestmark = [pytest.mark.root, pytest.mark.timeout(300)]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PlatformServer]:
    with PlatformServer.start(
        tmp_path_factory.mktemp("serve"),
        env={
            "PODBAY_LIFECYCLE_INTERVAL_SECONDS": "3600",
        },
    ) as s:
        yield s


def test_deleted_deployments_credentials_fail_at_once(server: PlatformServer) -> None:
    doomed = server.create_deployment("doomed")
    bystander = server.create_deployment("bystander")
    handle = server.attach(doomed, "s").json()
    other = server.attach(bystander, "s").json()
    assert server.exec(handle, "true").status_code == 200
    spawned = server.data(handle, "POST", "/v1/processes", json={"command": ["sleep", "600"]})
    assert spawned.status_code == 200, spawned.text

    server.cli("deployment", "delete", "doomed")

    r = server.exec(handle, "true")
    assert (r.status_code, r.json()["code"]) == (401, "SANDBOX_NOT_RUNNING"), r.text
    r = server.data(handle, "GET", "/v1/processes/" + spawned.json()["process_id"])
    assert r.status_code == 401
    r = server.attach(doomed, "s")
    assert (r.status_code, r.json()["code"]) == (401, "IDENTITY_TOKEN_INVALID")
    # Another deployment's sandbox is untouched.
    assert server.exec(other, "true").status_code == 200
