"""E2B's SDKs against a podbay cluster: a temporary PostgreSQL, two ``podbay
control`` replicas behind haproxy and a ``podbay node``; ``E2B_API_URL`` is
the load balancer, ``E2B_SANDBOX_URL`` the node (the data-plane tier: control
replicas refuse sandbox traffic). A representative subset of the
single-server suites: create, commands, files, the code interpreter,
``get_host``, pause and connect; sync and async."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
from websockets.exceptions import InvalidStatus
from websockets.sync.client import connect

from podbay.testing.local_cluster import LocalCluster

e2b = pytest.importorskip("e2b")
ci = pytest.importorskip("e2b_code_interpreter")

pytestmark = pytest.mark.root
SPEC = "name: {name}\nsandbox:\n  toolchain: never\n"
DOMAIN = "nodes.podbay.test"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster.start(
        tmp_path_factory.mktemp("e2b-cluster"),
        controls=2,
        nodes=1,
        # get_host's addresses name the nodes (their wildcard DNS name).
        env={"PODBAY_SERVER_E2B_DOMAIN": DOMAIN},
    ) as c:
        _until_every_replica_places_sandboxes(c)
        yield c


def _until_every_replica_places_sandboxes(cluster: LocalCluster) -> None:
    """A replica whose view of the nodes predates their readiness refuses the
    class for up to a second (the view's age): wait until each one places a
    sandbox, so the tests start on a cluster that is up. (That refusal is a 409
    where a 503 with Retry-After belongs: an open item of the closing note.)"""
    token = cluster.create_deployment("e2b-cluster-probe")
    for i in range(len(cluster.controls)):
        deadline = time.monotonic() + 60
        while (r := cluster.attach(token, f"probe-{i}", control=i)).status_code != 200:
            assert time.monotonic() < deadline, r.text
            time.sleep(0.2)
        httpx.delete(
            f"{cluster.controls[i].url}/api/v1/sandboxes/probe-{i}",
            headers={"Authorization": f"Bearer {token}"},
            timeout=120,
        ).raise_for_status()


@pytest.fixture(scope="module")
def opts(cluster: LocalCluster) -> dict[str, Any]:
    out = cluster.cli(
        "deployment",
        "create",
        "e2b-cluster",
        "--spec",
        "-",
        "--e2b-key",
        input=SPEC.format(name="e2b-cluster"),
    )
    key = out.stdout.strip().splitlines()[-1]
    return {"api_key": key, "api_url": cluster.url, "sandbox_url": cluster.nodes[0].url}


def _websocket(server_url: str, host: str, token: str) -> None:
    """Open a WebSocket to ``get_host``'s ``host``, sent to ``server_url``."""
    address = urlsplit(server_url)
    sock = socket.create_connection((address.hostname, address.port))
    headers = {"E2B-Traffic-Access-Token": token}
    connect(f"ws://{host}/page.txt", sock=sock, additional_headers=headers, open_timeout=60)


def test_create_run_files_interpreter_host_pause_connect(
    cluster: LocalCluster, opts: dict[str, Any]
) -> None:
    sandbox = ci.Sandbox.create(template="base", **opts)
    try:
        assert sandbox.commands.run("echo hi").stdout == "hi\n"
        sandbox.files.write("/tmp/page.txt", "served\n")
        assert sandbox.files.read("/tmp/page.txt") == "served\n"
        assert sandbox.run_code("x = 20").error is None
        assert sandbox.run_code("x + 1").text == "21"

        sandbox.commands.run(
            "cd /tmp && exec python3 -m http.server 8080 --bind 127.0.0.1", background=True
        )
        host = sandbox.get_host(8080)
        assert host == f"8080-{sandbox.sandbox_id}.{DOMAIN}"
        node = cluster.nodes[0].url
        headers = {"Host": host, "E2B-Traffic-Access-Token": sandbox.traffic_access_token}
        while True:  # until the server listens; pytest's timeout bounds this
            answer = httpx.get(node + "/page.txt", headers=headers, timeout=30)
            if answer.status_code != 502:
                break
            time.sleep(0.2)
        assert (answer.status_code, answer.text) == (200, "served\n")
        refused = httpx.get(node + "/page.txt", headers={"Host": host}, timeout=30)
        assert refused.status_code == 401
        # A WebSocket to that address reaches the port too, through the node's
        # data plane: here a plain HTTP server, which refuses the upgrade.
        with pytest.raises(InvalidStatus) as refused_ws:
            _websocket(node, host, sandbox.traffic_access_token)
        assert refused_ws.value.response.status_code == 502
        assert json.loads(refused_ws.value.response.body)["error_code"] == "PORT_UNREACHABLE"

        # The control replicas never carry the sandbox's traffic: refused there.
        for url in (cluster.url, *(c.url for c in cluster.controls)):
            misdirected = httpx.get(url + "/page.txt", headers=headers, timeout=30)
            assert misdirected.status_code == 421
            with pytest.raises(InvalidStatus) as misdirected_ws:
                _websocket(url, host, sandbox.traffic_access_token)
            assert misdirected_ws.value.response.status_code == 421
            assert misdirected.json()["error_code"] == "E2B_SANDBOX_URL_MISDIRECTED"
            via_control = e2b.Sandbox.connect(sandbox.sandbox_id, **{**opts, "sandbox_url": url})
            with pytest.raises(e2b.SandboxException):
                via_control.commands.run("echo never")

        sandbox.pause()
        paused = e2b.Sandbox.list(
            query=e2b.SandboxQuery(state=[e2b.SandboxState.PAUSED]), **opts
        ).next_items()
        assert sandbox.sandbox_id in [s.sandbox_id for s in paused]
        again = ci.Sandbox.connect(sandbox.sandbox_id, **opts)
        assert again.run_code("x + 2").text == "22"  # memory kept across the pause
        assert again.files.read("/tmp/page.txt") == "served\n"
    finally:
        sandbox.kill()


def test_async_sdk(opts: dict[str, Any]) -> None:
    async def main() -> None:
        sandbox = await e2b.AsyncSandbox.create(**opts)
        try:
            assert (await sandbox.commands.run("echo async")).stdout == "async\n"
            await sandbox.files.write("/tmp/a.bin", b"\x00\xff")
            assert await sandbox.files.read("/tmp/a.bin", format="bytes") == b"\x00\xff"
            await sandbox.pause()
            again = await e2b.AsyncSandbox.connect(sandbox.sandbox_id, **opts)
            assert (await again.commands.run("cat /tmp/a.bin | wc -c")).stdout == "2\n"
        finally:
            await sandbox.kill()

    asyncio.run(main())
