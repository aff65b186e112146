"""The nodes' routes as the control plane keeps them, through the public API
(``podbay.testing.cluster.LocalCluster``: PostgreSQL, two ``podbay control``
behind haproxy, two ``podbay node``, real sandboxes):

* attaching a running sandbox asks its node nothing (the node keeps the
  routes it was given; the store records which node process took each);
* a restarted node's routes are published again on the next attach;
* a deleted deployment's or sandbox's credentials are refused by its node at
  once, not at a lifecycle pass (here an hour away), as under ``serve``
  (tests/security/test_lifecycle_deleted_deployment.py).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from podbay.testing.cluster import LocalCluster

pytestmark = pytest.mark.root


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster.start(
        tmp_path_factory.mktemp("cluster"),
        controls=2,
        nodes=2,
        env={"PODBAY_LIFECYCLE_INTERVAL_SECONDS": "3600"},
    ) as c:
        yield c


@pytest.fixture(scope="module")
def token(cluster: LocalCluster) -> str:
    return cluster.create_deployment("routes-agent")


def _attached(
    cluster: LocalCluster, token: str, name: str, control: int | None = None
) -> dict[str, Any]:
    r = cluster.attach(token, name, control=control)
    assert r.status_code == 200, r.text
    return dict(r.json())


def _exec(handle: dict[str, Any], *argv: str) -> httpx.Response:
    return httpx.post(
        handle["endpoint"] + "/v1/exec",
        headers=handle["headers"],
        json={"command": list(argv)},
        timeout=60,
    )


def _refused(r: httpx.Response) -> tuple[int, str]:
    return r.status_code, r.json().get("code")


def test_attaching_a_running_sandbox_asks_its_node_nothing(cluster, token):
    handle = _attached(cluster, token, "steady")
    assert _exec(handle, "true").status_code == 200
    node = cluster.node_for(handle["endpoint"])
    # A stopped node answers nothing: an attach that called it would wait for
    # the control plane's call to time out (a minute), past this client's 20 s.
    os.kill(node.pid(), signal.SIGSTOP)
    try:
        for control in cluster.controls:
            r = httpx.put(
                f"{control.url}/api/v1/sandboxes/steady",
                headers={"Authorization": f"Bearer {token}"},
                timeout=20,
            )
            assert r.status_code == 200, r.text
            again = r.json()
            assert again["start"] == "reused" and again["endpoint"] == handle["endpoint"]
    finally:
        os.kill(node.pid(), signal.SIGCONT)
    assert _exec(again, "true").status_code == 200


def test_a_restarted_nodes_routes_are_published_again(cluster, token):
    handle = _attached(cluster, token, "survivor")
    node = cluster.node_for(handle["endpoint"])
    node.restart()  # SIGTERM: sandboxes keep running; its routes were in memory
    for control in (1, 0):
        again = _attached(cluster, token, "survivor", control=control)
        assert again["start"] == "reused"
        assert _exec(again, "true").status_code == 200


def test_a_deleted_deployments_sandboxes_are_refused_at_once_on_every_node(cluster):
    doomed = cluster.create_deployment("doomed")
    bystander = cluster.create_deployment("bystander")
    # New sandboxes go to the emptier node: attach until both nodes hold one.
    handles: list[dict[str, Any]] = []
    while len({cluster.node_for(h["endpoint"]).name for h in handles}) < 2:
        assert len(handles) < 8, "placement never used the second node"
        handles.append(_attached(cluster, doomed, f"d-{len(handles)}"))
    other = _attached(cluster, bystander, "s")
    spawned = httpx.post(
        handles[0]["endpoint"] + "/v1/processes",
        headers=handles[0]["headers"],
        json={"command": ["sleep", "600"]},
        timeout=60,
    )
    assert spawned.status_code == 200, spawned.text
    for h in handles:
        assert _exec(h, "true").status_code == 200

    cluster.cli("deployment", "delete", "doomed")

    for h in handles:
        assert _refused(_exec(h, "true")) == (401, "SANDBOX_NOT_RUNNING")
    process = httpx.get(
        handles[0]["endpoint"] + "/v1/processes/" + spawned.json()["process_id"],
        headers=handles[0]["headers"],
        timeout=60,
    )
    assert process.status_code == 401
    assert _refused(cluster.attach(doomed, "d-0")) == (401, "IDENTITY_TOKEN_INVALID")
    assert _exec(other, "true").status_code == 200  # another deployment's: untouched


def test_a_deleted_sandbox_is_refused_at_once(cluster, token):
    handle = _attached(cluster, token, "short-lived", control=0)
    assert _exec(handle, "true").status_code == 200
    deleted = cluster.controls[1].api("DELETE", "/api/v1/sandboxes/short-lived", token)
    assert deleted.status_code == 204, deleted.text
    assert _refused(_exec(handle, "true")) == (401, "SANDBOX_NOT_RUNNING")
