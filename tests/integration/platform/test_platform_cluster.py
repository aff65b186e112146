"""Split roles on one machine, through the HTTP API: a temporary PostgreSQL,
two ``podbay control`` replicas (behind haproxy) and two ``podbay node``
hosts with real runc sandboxes. Calls go to one replica or the other
directly where the test is about replicas. The tests share one cluster and
run in file order; the last one kills a node."""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from podbay.client import SandboxClient, SandboxUnavailableError
from podbay.testing.local_cluster import LocalCluster
from podbay.testing.platform import PlatformServer

pytestmark = pytest.mark.root
LOST_SECONDS = 8


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster.start(
        tmp_path_factory.mktemp("cluster"),
        controls=2,
        nodes=2,
        env={
            "PODBAY_CLUSTER_HEARTBEAT_SECONDS": "0.5",
            "PODBAY_CLUSTER_NODE_LOST_SECONDS": str(LOST_SECONDS),
            "PODBAY_LIFECYCLE_INTERVAL_SECONDS": "1",
            "PODBAY_CAPS_PER_DEPLOYMENT": "50",
        },
    ) as c:
        yield c


@pytest.fixture(scope="module")
def token(cluster: LocalCluster) -> str:
    return cluster.create_deployment("cluster-agent")


def _attach(cluster: LocalCluster, token: str, name: str, control: int = 0) -> httpx.Response:
    return cluster.controls[control].attach(token, name)


def _name(node: PlatformServer) -> str:
    return node.env["PODBAY_NODE_NAME"]


def _exec(handle: dict[str, Any], *argv: str) -> httpx.Response:
    return httpx.post(
        handle["endpoint"] + "/v1/exec",
        headers=handle["headers"],
        json={"command": list(argv)},
        timeout=60,
    )


def _node_of(cluster: LocalCluster, handle: dict[str, Any]) -> str:
    return _name(cluster.node_for(handle["endpoint"]))


def _kid(credential: str) -> str:
    head = credential.split(".")[0]
    return str(json.loads(base64.urlsafe_b64decode(head + "=" * (-len(head) % 4)))["kid"])


def test_sandboxes_are_placed_on_nodes_and_served_there(cluster, token):
    handles = []
    for i in range(4):
        r = _attach(cluster, token, f"spread-{i}", i % 2)
        assert r.status_code == 200, r.text
        handles.append(r.json())
    # The data plane is the node's own: endpoints name nodes, never a control replica.
    assert {_node_of(cluster, h) for h in handles} == {"node-0", "node-1"}
    for i, h in enumerate(handles):
        answer = _exec(h, "hostname")
        assert answer.status_code == 200, answer.text
        assert answer.json()["stdout"].strip() == f"spread-{i}"
    metrics = httpx.get(cluster.node_for(handles[0]["endpoint"]).base_url + "/metrics")
    assert metrics.status_code == 200
    assert "podbay_gateway_request_seconds" in metrics.text
    # Either replica answers for any sandbox, and it stays where it was made.
    again = _attach(cluster, token, "spread-0", 1).json()
    assert again["start"] == "reused"
    assert again["endpoint"] == handles[0]["endpoint"]


def test_replicas_racing_on_one_new_name_make_one_sandbox(cluster, token):
    with ThreadPoolExecutor(12) as pool:
        answers = list(pool.map(lambda i: _attach(cluster, token, "raced", i % 2), range(12)))
    assert [r.status_code for r in answers] == [200] * 12, [r.text for r in answers]
    assert len({r.json()["endpoint"] for r in answers}) == 1
    assert sorted(r.json()["start"] for r in answers).count("created") == 1
    listed = httpx.get(
        cluster.url + "/api/v1/sandboxes",
        headers={"Authorization": f"Bearer {token}"},
    ).json()["sandboxes"]
    assert [s["name"] for s in listed].count("raced") == 1


def test_a_suspended_sandbox_resumes_on_its_node(cluster, token):
    first = _attach(cluster, token, "sleeper").json()
    assert _exec(first, "sh", "-c", "echo kept > /tmp/mark").status_code == 200
    auth = {"Authorization": f"Bearer {token}"}
    stop = httpx.post(cluster.controls[1].base_url + "/api/v1/sandboxes/sleeper/stop", headers=auth)
    assert stop.status_code == 204, stop.text
    record = httpx.get(cluster.url + "/api/v1/sandboxes/sleeper", headers=auth).json()
    assert record["state"] == "suspended"
    resumed = _attach(cluster, token, "sleeper").json()
    assert resumed["start"] == "resumed"
    assert resumed["endpoint"] == first["endpoint"]
    assert _exec(resumed, "cat", "/tmp/mark").json()["stdout"] == "kept\n"


def test_attach_options_reach_the_node_that_holds_the_sandbox(cluster, token):
    body = {"env": {"WHERE": "node"}, "memory_mib": 320, "labels": {"k": "v"}}
    r = cluster.controls[1].attach(token, "shaped", json=body)
    assert r.status_code == 200, r.text
    handle = r.json()
    script = "echo $WHERE; cat /sys/fs/cgroup/memory/memory.limit_in_bytes"
    where, limit = _exec(handle, "sh", "-c", script).json()["stdout"].split()
    assert (where, int(limit)) == ("node", 320 << 20)
    record = cluster.controls[0].api("GET", "/api/v1/sandboxes/shaped", token).json()
    assert (record["labels"], record["memory_mib"]) == ({"k": "v"}, 320)


def test_node_and_data_plane_credentials_are_never_interchangeable(cluster, token):
    handle = _attach(cluster, token, "creds").json()
    credential = handle["headers"]["X-Podbay-Credential"]
    node = cluster.node_for(handle["endpoint"])
    node_credential = (node.data_dir / "node-credential").read_text().strip()

    def code(r: httpx.Response) -> tuple[int, str]:
        return r.status_code, r.json()["code"]

    refused = (401, "NODE_CREDENTIAL_INVALID")
    # A data-plane credential, an identity token or nothing: not a control call on the node.
    for bearer in (credential, token, node_credential, None):
        headers = {"Authorization": f"Bearer {bearer}"} if bearer else {}
        assert code(httpx.get(node.base_url + "/internal/v1/machines", headers=headers)) == refused
    # ...nor a node's credential on the control plane.
    for bearer in (credential, token):
        r = httpx.get(
            cluster.url + "/internal/v1/keys", headers={"Authorization": f"Bearer {bearer}"}
        )
        assert code(r) == refused
    assert (
        httpx.get(
            cluster.url + "/internal/v1/keys",
            headers={"Authorization": f"Bearer {node_credential}"},
        ).status_code
        == 200
    )
    # The node's credential is no data-plane credential either.
    r = httpx.post(
        handle["endpoint"] + "/v1/exec",
        headers={"X-Podbay-Credential": node_credential},
        json={"command": ["true"]},
    )
    assert code(r) == (401, "CREDENTIAL_INVALID")
    # Enrolling needs the enrollment token.
    r = httpx.post(
        cluster.url + "/internal/v1/nodes/enroll",
        json={"name": "intruder", "url": "http://127.0.0.1:9", "token": "guess", "report": {}},
    )
    assert code(r) == refused


def test_a_rotated_key_signs_and_nodes_fetch_it(cluster, token):
    before = _attach(cluster, token, "rotation").json()
    kid = cluster.cli("deployment", "keys", "rotate").stdout.strip()
    assert kid != _kid(before["headers"]["X-Podbay-Credential"])
    deadline = time.monotonic() + 30
    while True:  # each replica re-reads the keys every lifecycle pass (1 s here)
        handle = _attach(cluster, token, "rotation", 1).json()
        if _kid(handle["headers"]["X-Podbay-Credential"]) == kid:
            break
        assert time.monotonic() < deadline, "the replica never signed with the new key"
        time.sleep(0.5)
    assert _exec(handle, "true").status_code == 200  # the node fetched the new public key
    assert _exec(before, "true").status_code == 200  # the old key still verifies


def test_a_restarted_node_keeps_its_sandboxes(cluster, token):
    handle = _attach(cluster, token, "survivor").json()
    assert _exec(handle, "sh", "-c", "echo still > /tmp/here").status_code == 200
    node = cluster.node_for(handle["endpoint"])
    node.restart()  # SIGTERM: sandboxes keep running; the next start adopts them
    again = _attach(cluster, token, "survivor").json()
    assert again["endpoint"] == handle["endpoint"]
    assert again["start"] == "reused"
    assert _exec(again, "cat", "/tmp/here").json()["stdout"] == "still\n"


def test_a_killed_node_is_lost_until_drained(cluster, token):
    auth = {"Authorization": f"Bearer {token}"}
    victim = cluster.nodes[1]
    # New sandboxes go to the emptier node: attach until each node holds one.
    handles: dict[str, dict[str, Any]] = {}
    for i in range(12):
        r = _attach(cluster, token, f"lose-{i}")
        assert r.status_code == 200, r.text
        handles[f"lose-{i}"] = r.json()
        if len({_node_of(cluster, h) for h in handles.values()}) == 2:
            break
    doomed = [n for n, h in handles.items() if _node_of(cluster, h) == _name(victim)]
    kept = [n for n, h in handles.items() if _node_of(cluster, h) != _name(victim)]
    assert doomed
    assert kept
    victim.kill9()
    # Until it is lost, attach answers its route from the store (inherent to
    # a timeout); calls to it do not connect: nothing was sent, and the SDK's
    # error carries the connection error that says so (safe to repeat).
    early = _attach(cluster, token, doomed[0], 1)
    assert early.status_code == 200, early.text
    assert early.json()["endpoint"] == handles[doomed[0]]["endpoint"]
    client = SandboxClient(identity_token=token, server_url=cluster.url)
    with client, pytest.raises(SandboxUnavailableError) as caught:
        client.exec(doomed[0], ["true"])
    assert isinstance(caught.value.cause, httpx.ConnectError)
    deadline = time.monotonic() + LOST_SECONDS + 20
    while True:
        record = httpx.get(f"{cluster.url}/api/v1/sandboxes/{doomed[0]}", headers=auth)
        if record.json()["state"] == "lost":
            break
        assert time.monotonic() < deadline, "the sandbox was never reported lost"
        time.sleep(0.5)
    refused = _attach(cluster, token, doomed[0], 1)
    assert refused.status_code == 409
    assert refused.json()["code"] == "SANDBOX_NODE_LOST"
    assert "drain" in refused.json()["error"]
    # The other node's sandboxes are untouched.
    assert _exec(_attach(cluster, token, kept[0]).json(), "true").status_code == 200
    listed = json.loads(cluster.cli("node", "list", "--json").stdout)
    assert {n["name"]: n["state"] for n in listed} == {"node-0": "ready", _name(victim): "lost"}
    cluster.cli("node", "drain", _name(victim))
    fresh = _attach(cluster, token, doomed[0])
    assert fresh.status_code == 200, fresh.text
    assert fresh.json()["start"] == "created"
    assert _node_of(cluster, fresh.json()) == "node-0"
