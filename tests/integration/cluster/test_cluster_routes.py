"""The nodes' routes as the control plane keeps them, through the public API
(``podbay.testing.local_cluster.LocalCluster``: PostgreSQL, two ``podbay control``
behind haproxy, two ``podbay node``, real sandboxes):

* attaching a running sandbox asks its node nothing (the node keeps the
  routes it was given; the store records which node process took each);
* a restarted node's routes are published again on the next attach, and
  no attach hands out a route while it starts (it reports its new boot
  before serving);
* a machine killed underneath is carried over by the very next attach (the
  node reports its 502 to the control plane before the client hears it);
* a deleted deployment's or sandbox's credentials are refused by its node at
  once, not at a lifecycle pass (here an hour away), as under ``serve``
  (tests/security/test_lifecycle_deleted_deployment.py).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import httpx
import psycopg
import pytest

from podbay.testing.local_cluster import LocalCluster
from podbay.testing.postgres import TemporaryCluster

pytestmark = pytest.mark.root


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory, postgres: TemporaryCluster
) -> Iterator[LocalCluster]:
    with LocalCluster.start(
        tmp_path_factory.mktemp("cluster"),
        controls=2,
        nodes=2,
        env={"PODBAY_LIFECYCLE_INTERVAL_SECONDS": "3600"},
        postgres=postgres,
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
            assert again["start"] == "reused"
            assert again["endpoint"] == handle["endpoint"]
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


def test_no_attach_hands_out_a_route_while_a_node_restarts(cluster, token):
    """The restarted node reports its new boot before it serves anything: an
    attach meanwhile is refused as temporary (503 with Retry-After, as the SDK
    waits out) or answers a handle that works, never one whose route is gone."""
    handle = _attached(cluster, token, "restarting")
    node = cluster.node_for(handle["endpoint"])
    node.terminate()
    node.spawn()
    deadline = time.monotonic() + 60
    while True:  # the first moment the new process answers at all
        try:
            node.http.get("/healthz", timeout=2)
            break
        except httpx.TransportError:
            assert time.monotonic() < deadline
            time.sleep(0.02)
    refused = 0
    while True:
        r = cluster.attach(token, "restarting")
        if r.status_code == 503 and "Retry-After" in r.headers:
            refused += 1
            assert time.monotonic() < deadline, r.text
            time.sleep(0.1)
            continue
        assert r.status_code == 200, r.text
        assert r.json()["endpoint"] == handle["endpoint"]
        done = _exec(r.json(), "true")
        assert done.status_code == 200, (refused, done.text)
        break
    node.wait_ready()


def test_a_machine_killed_underneath_is_carried_over_by_the_next_attach(cluster, token):
    """Its node's gateway answers 502 AGENT_UNREACHABLE; the control plane has
    checked the machine before that answer left, so the attach right after
    starts it again with its files (not a heartbeat later)."""
    handle = _attached(cluster, token, "doomed-machine")
    assert _exec(handle, "sh", "-c", "echo kept > /workspace/f").status_code == 200
    node = cluster.node_for(handle["endpoint"])
    sandbox_id = handle["endpoint"].rsplit("/", 1)[1]
    with psycopg.connect(cluster.store_url, autocommit=True) as db:
        row = db.execute("SELECT machine_id FROM sandboxes WHERE id=%s", (sandbox_id,)).fetchone()
    assert row is not None
    subprocess.run(["runc", "--root", f"{node.run_dir}/runc", "kill", row[0], "KILL"], check=True)
    deadline = time.monotonic() + 10
    while (r := _exec(handle, "true")).status_code != 502:
        assert time.monotonic() < deadline, r.text
        time.sleep(0.05)
    assert r.json()["code"] == "AGENT_UNREACHABLE"
    again = _attached(cluster, token, "doomed-machine")
    assert again["start"] == "carried_over"
    assert _exec(again, "cat", "/workspace/f").json()["stdout"] == "kept\n"


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


def test_a_deployment_deleted_through_the_operator_api_is_refused_at_once(cluster):
    """``DELETE /api/v1/deployments/{name}`` on a replica withdraws the routes
    on the nodes as ``podbay deployment delete`` does: no lifecycle pass awaited."""
    operator = cluster.cli("admin", "token").stdout.strip().splitlines()[-1]
    bearer = {"Authorization": f"Bearer {operator}"}
    made = httpx.post(
        cluster.url + "/api/v1/deployments",
        json={"name": "doomed-by-api"},
        headers=bearer,
        timeout=60,
    )
    assert made.status_code == 201, made.text
    handle = _attached(cluster, made.json()["token"], "d")
    assert _exec(handle, "true").status_code == 200
    r = httpx.delete(cluster.url + "/api/v1/deployments/doomed-by-api", headers=bearer, timeout=60)
    assert r.status_code == 204, r.text
    assert _refused(_exec(handle, "true")) == (401, "SANDBOX_NOT_RUNNING")
