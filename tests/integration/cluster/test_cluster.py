"""The multi-node shape on one machine, through the public API only:
PostgreSQL, two ``podbay control`` behind haproxy, three ``podbay node``
(``podbay.testing.local_cluster.LocalCluster``), real sandboxes.

The package's cluster (conftest.py), left with no sandbox for the next
module. Losing a node is tested in
tests/integration/platform/test_platform_cluster.py; its figures are in
bench/cluster.py."""

from __future__ import annotations

import concurrent.futures
import hashlib
import http.client
import json
import os
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest

from podbay.client import NetworkPolicy, SandboxClient
from podbay.testing.console import run_in_terminal, terminal_refused, terminal_url
from podbay.testing.local_cluster import LocalCluster, PortCounters, process_io

pytestmark = pytest.mark.root

ROOT = Path(__file__).resolve().parents[3]
MIB = 1 << 20


@pytest.fixture(scope="module")
def token(cluster: LocalCluster) -> Iterator[str]:
    token = cluster.create_deployment("cluster-agent")
    yield token
    # The cluster goes on to test_cluster_moves.py, whose drains count sandboxes.
    with SandboxClient(identity_token=token, server_url=cluster.url) as client:
        for sandbox in client.list():
            client.delete(sandbox.name)


@pytest.fixture
def client(cluster: LocalCluster, token: str) -> Iterator[SandboxClient]:
    with SandboxClient(identity_token=token, server_url=cluster.url) as c:
        yield c


def test_every_node_is_enrolled_and_listed(cluster: LocalCluster) -> None:
    listing = cluster.cli("node", "list").stdout
    for node in cluster.nodes:
        assert node.env["PODBAY_NODE_NAME"] in listing


def test_the_sdk_works_through_the_load_balancer_with_data_on_the_node(
    cluster: LocalCluster, client: SandboxClient, token: str
) -> None:
    name = f"c-{uuid.uuid4().hex[:8]}"
    handle = client.attach(name)
    assert handle.state == "running"
    raw = cluster.attach(token, name).json()
    # The handle sends the data plane to the node that holds the sandbox.
    node = cluster.node_for(raw["endpoint"])
    assert not raw["endpoint"].startswith(cluster.url)
    result = client.exec(name, ["/bin/sh", "-c", "echo hi; hostname"])
    assert result.exit_code == 0
    assert result.stdout.startswith("hi\n")
    client.write_file(name, "/tmp/x.txt", "through the node")
    assert client.read_file(name, "/tmp/x.txt") == "through the node"
    assert node.process is not None
    assert node.process.poll() is None
    client.delete(name)


def test_enrolling_as_an_enrolled_node_is_refused_and_the_node_keeps_its_calls(
    cluster: LocalCluster, client: SandboxClient, token: str
) -> None:
    """Whoever holds the enrollment token cannot take an enrolled node's name:
    409, and control calls keep going to the real node (which takes them:
    they name its enrollment), so its sandboxes keep working."""
    victim = cluster.nodes[0].env["PODBAY_NODE_NAME"]
    r = httpx.post(
        cluster.url + "/internal/v1/nodes/enroll",
        json={
            "name": victim,
            "url": "http://127.0.0.1:9",
            "token": cluster.enrollment_token,
            "report": {"ready": True, "classes": ["container"], "default": "container"},
        },
    )
    assert r.status_code == 409, r.text
    assert r.json()["code"] == "NODE_NAME_TAKEN", r.text
    assert "credential" not in r.json()
    listed = {n["name"]: n for n in json.loads(cluster.cli("node", "list", "--json").stdout)}
    assert listed[victim]["url"] == cluster.nodes[0].url
    # The node still takes the control plane's calls: new sandboxes go to the
    # least loaded node, so one lands on it within a few attaches.
    names: list[str] = []
    try:
        for i in range(3 * len(cluster.nodes)):
            names.append(f"e-{i}-{uuid.uuid4().hex[:6]}")
            raw = cluster.attach(token, names[-1]).json()
            assert client.exec(names[-1], ["true"]).exit_code == 0
            if cluster.node_for(raw["endpoint"]) is cluster.nodes[0]:
                break
        else:
            raise AssertionError(f"no sandbox was placed on {victim}")
    finally:
        for name in names:
            client.delete(name)


def test_the_client_contract_suite_passes_against_the_cluster(
    cluster: LocalCluster, token: str
) -> None:
    """tests/integration/client (every SDK method) aimed at the load balancer
    instead of a ``podbay serve``."""
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-x",
            "-p",
            "no:cacheprovider",
            # pyproject's addopts load the suite's plugins; these two it does not use.
            "-p",
            "no:_hypothesis_pytestplugin",
            "-p",
            "no:schemathesis.pytest.plugin",
            # The sync face: the async one speaks the same wire (and doubles the time).
            "-k",
            "not async",
            str(ROOT / "tests" / "integration" / "client" / "test_client_platform.py"),
        ],
        env={
            **os.environ,
            "PODBAY_TEST_SERVER_URL": cluster.url,
            "PODBAY_TEST_TOKEN": token,
        },
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert " passed" in result.stdout
    assert "skipped" not in result.stdout


def test_concurrent_first_attaches_through_both_replicas_make_one_sandbox(
    cluster: LocalCluster, token: str
) -> None:
    name = f"race-{uuid.uuid4().hex[:8]}"
    count = 16
    barrier = threading.Barrier(count)

    def one(i: int) -> httpx.Response:
        barrier.wait()
        return cluster.attach(token, name, control=i % len(cluster.controls))

    with concurrent.futures.ThreadPoolExecutor(count) as pool:
        answers = list(pool.map(one, range(count)))
    assert {r.status_code for r in answers} == {200}, [r.text for r in answers]
    assert len({r.json()["endpoint"] for r in answers}) == 1
    assert [r.json()["start"] for r in answers].count("reused") == count - 1


def test_a_100_mib_upload_goes_through_the_node_and_never_the_control_plane(
    cluster: LocalCluster, client: SandboxClient, token: str
) -> None:
    name = f"up-{uuid.uuid4().hex[:8]}"
    client.attach(name)
    node = cluster.node_for(cluster.attach(token, name).json()["endpoint"])
    controls = [c for c in cluster.controls if c.process and c.process.poll() is None]
    assert node.process is not None
    ports = {"node": node.port, **{f"control-{i}": c.port for i, c in enumerate(controls)}}
    before_lb = cluster.balancer.counters()
    before_io = {c.pid(): process_io(c.pid()) for c in controls}

    payload = os.urandom(MIB) * 100
    with PortCounters(ports) as counters:
        client.write_file_bytes(name, "/tmp/big.bin", payload)
        on_ports = counters.read()
    check = client.exec(name, ["/bin/sh", "-c", "sha256sum /tmp/big.bin"])
    assert check.stdout.split()[0] == hashlib.sha256(payload).hexdigest()

    after_lb = cluster.balancer.counters()
    carried = {
        server: after_lb[server].bytes_in
        - before_lb[server].bytes_in
        + after_lb[server].bytes_out
        - before_lb[server].bytes_out
        for server in before_lb
    }
    moved = {
        pid: process_io(pid)["rchar"] - io["rchar"] + process_io(pid)["wchar"] - io["wchar"]
        for pid, io in before_io.items()
    }
    print(f"\nbytes on each port during the upload (kernel counters): {on_ports}")
    print(f"load balancer bytes per control replica: {carried}")
    print(f"control processes' read+written bytes: {moved}")
    # The node's port carried the upload (so the counters do see such traffic:
    # the kernel counts it however the gateway moves it, splice included) ...
    assert on_ports.pop("node") >= len(payload)
    # ... and the control plane carried none of it: what it did move in that
    # time (heartbeats, credential renewals, store queries) is under 1% of it.
    assert all(count < MIB for count in on_ports.values()), on_ports
    assert sum(carried.values()) < MIB, carried
    assert all(m < 4 * MIB for m in moved.values()), moved
    client.delete(name)


def test_the_operator_api_lists_and_drains_nodes(cluster: LocalCluster) -> None:
    """``/api/v1/nodes`` on a control replica: the cluster's nodes from its
    store, and a drain through the API marks the node as ``podbay node drain``
    starts by doing (undone after: the module's other tests place sandboxes)."""
    operator = cluster.cli("admin", "token").stdout.strip().splitlines()[-1]
    bearer = {"Authorization": f"Bearer {operator}"}
    names = sorted(node.env["PODBAY_NODE_NAME"] for node in cluster.nodes)
    listed = httpx.get(cluster.url + "/api/v1/nodes", headers=bearer, timeout=30).json()["nodes"]
    assert sorted(n["name"] for n in listed) == names
    assert {n["state"] for n in listed} == {"ready"}
    r = httpx.post(cluster.url + f"/api/v1/nodes/{names[0]}/drain", headers=bearer, timeout=30)
    try:
        assert (r.status_code, r.json()) == (202, {"name": names[0], "state": "draining"})
        listed = httpx.get(cluster.url + "/api/v1/nodes", headers=bearer, timeout=30).json()
        states = {n["name"]: n["state"] for n in listed["nodes"]}
        assert states[names[0]] == "draining"
    finally:
        cluster.cli("node", "undrain", names[0])
    r = httpx.post(cluster.url + "/api/v1/nodes/no-such-node/drain", headers=bearer, timeout=30)
    assert (r.status_code, r.json()["code"]) == (404, "NODE_NOT_FOUND")
    # The console's page is served by a control replica too.
    page = httpx.get(cluster.url + "/", timeout=30)
    assert page.status_code == 200
    assert "content-security-policy" in page.headers


def test_the_console_reaches_a_sandbox_on_its_node_through_a_replica(
    cluster: LocalCluster, token: str
) -> None:
    """The console's data plane on a control replica: files, exec and the
    terminal relayed to the node that holds the sandbox (a replica has no
    gateway), with the session's checks first."""
    assert cluster.attach(token, "console-relay").status_code == 200
    with httpx.Client(
        base_url=cluster.url, timeout=120, headers={"Origin": cluster.url}
    ) as browser:
        doc = browser.post("/console/session", json={"token": token}).json()
        csrf = {"X-CSRF-Token": doc["csrf"]}
        base = f"/console/sandboxes/{doc['deployment']}/console-relay"
        payload = os.urandom(3 * MIB)
        digest = {"X-Podbay-Sha256": hashlib.sha256(payload).hexdigest()}
        r = browser.put(
            f"{base}/v1/files?path=/workspace/blob", content=payload, headers={**csrf, **digest}
        )
        assert r.status_code in (200, 201, 204), r.text
        r = browser.get(f"{base}/v1/files?path=/workspace/blob")
        assert r.status_code == 200
        assert hashlib.sha256(r.content).digest() == hashlib.sha256(payload).digest()
        assert r.headers["content-disposition"] == "attachment"
        r = browser.post(f"{base}/v1/exec", json={"command": ["hostname"]}, headers=csrf)
        assert r.status_code == 200
        assert r.json()["exit_code"] == 0
        r = browser.get(f"{base}/v1/files?path=/no/such")
        assert (r.status_code, r.json()["code"]) == (404, "PATH_NOT_FOUND")
        # Dot segments, sent raw: the relay's URL library would resolve them into a
        # port's relay (a sandbox's page in the console's origin).
        parts = urlsplit(cluster.url)
        for sneaky in ("/v1/files/../ports/8080/", "/v1/files/%2e%2e/ports/8080/"):
            conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=60)
            conn.request(
                "GET",
                base + sneaky,
                headers={"Cookie": f"podbay_session={browser.cookies['podbay_session']}"},
            )
            answer = conn.getresponse()
            refusal = (answer.status, json.loads(answer.read())["code"])
            conn.close()
            assert refusal == (404, "ROUTE_NOT_FOUND"), sneaky
        ws_url = terminal_url(cluster.url, base)
        session = browser.cookies["podbay_session"]
        assert terminal_refused(ws_url, session, "http://evil.example")[0] == 403
        run_in_terminal(ws_url, session, cluster.url, exit_code=3)
        assert terminal_refused(ws_url, None, cluster.url)[0] == 401  # no session
    httpx.delete(
        f"{cluster.url}/api/v1/sandboxes/console-relay",
        headers={"Authorization": f"Bearer {token}"},
        timeout=120,
    )


def test_an_egress_policy_travels_to_the_node_and_changes_there(
    cluster: LocalCluster, client: SandboxClient
) -> None:
    """attach's ``network`` rides the launch order to the node, ``PUT .../network``
    the node call: both hold in the sandbox's rules there. Only documentation
    addresses are tried, each refused inside the sandbox's namespace."""
    name = f"c-net-{uuid.uuid4().hex[:8]}"
    connect = "import socket, sys; socket.create_connection((sys.argv[1], 80), timeout=5)"
    client.attach(name, network=NetworkPolicy(deny=["192.0.2.0/24"]))
    try:
        assert client.network(name).deny == ["192.0.2.0/24"]
        denied = client.exec(name, ["python3", "-c", connect, "192.0.2.1"])
        assert denied.exit_code != 0
        assert "refused" in denied.stderr or "timed out" in denied.stderr, denied.stderr
        assert client.set_network(name, internet=False).internet is False
        assert client.network(name).internet is False
        cut = client.exec(name, ["python3", "-c", connect, "198.51.100.1"])
        assert cut.exit_code != 0
        assert "refused" in cut.stderr or "timed out" in cut.stderr, cut.stderr
    finally:
        client.delete(name)


def test_the_egress_audit_is_read_on_the_sandboxs_node(
    cluster: LocalCluster, client: SandboxClient
) -> None:
    """``GET .../egress`` through a control replica asks the node that holds the
    sandbox (``GET /internal/v1/machines/{class}/{machine}/egress``)."""
    name = f"c-audit-{uuid.uuid4().hex[:8]}"
    connect = "import socket, sys; socket.create_connection((sys.argv[1], 80), timeout=5)"
    client.attach(name, network=NetworkPolicy(deny=["192.0.2.0/24"]))
    try:
        assert client.exec(name, ["python3", "-c", connect, "192.0.2.1"]).exit_code != 0
        rows = client.egress(name).destinations
        refused = [
            d for d in rows if (d.address, d.port, d.verdict) == ("192.0.2.1", 80, "refused")
        ]
        assert len(refused) == 1, rows
        assert refused[0].protocol == "tcp"
        assert refused[0].packets >= 1
    finally:
        client.delete(name)
