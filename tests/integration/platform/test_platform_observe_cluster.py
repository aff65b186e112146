"""Per-sandbox observability in a cluster (docs/observability.md): the
control plane asks the node holding the sandbox for its metrics and command
log, and a node's OOM kills reach the control plane with its heartbeats."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from podbay.testing.local_cluster import LocalCluster

pytestmark = pytest.mark.root


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with LocalCluster.start(
        tmp_path_factory.mktemp("observe-cluster"),
        controls=1,
        nodes=1,
        env={
            "PODBAY_CLUSTER_HEARTBEAT_SECONDS": "0.5",
            "PODBAY_LIFECYCLE_INTERVAL_SECONDS": "0.5",
        },
    ) as c:
        yield c


def _get(cluster: LocalCluster, token: str, path: str) -> dict[str, Any]:
    r = cluster.controls[0].api("GET", f"/api/v1/sandboxes/{path}", token)
    assert r.status_code == 200, r.text
    doc: dict[str, Any] = r.json()
    return doc


def _wait(what: str, check: Any) -> Any:
    deadline = time.monotonic() + 60
    while not (found := check()):
        assert time.monotonic() < deadline, what
        time.sleep(0.25)
    return found


def test_metrics_commands_and_oom_events_come_from_the_node(cluster):
    token = cluster.create_deployment("observed")
    r = cluster.controls[0].attach(token, "far", json={"memory_mib": 256})
    assert r.status_code == 200, r.text
    h = r.json()
    samples = _wait("a sample", lambda: _get(cluster, token, "far/metrics")["samples"])
    assert samples[-1]["memory_limit_bytes"] == 256 << 20
    ran = httpx.post(
        h["endpoint"] + "/v1/exec",
        headers=h["headers"],
        json={"command": ["python3", "-c", "x = bytearray(600 << 20)"]},
        timeout=60,
    ).json()
    assert ran["exit_code"] == 137, ran
    (entry,) = _get(cluster, token, "far/commands")["commands"]
    assert (entry["argv"][0], entry["exit_code"]) == ("python3", 137)

    def oom() -> list[dict[str, Any]]:
        events = _get(cluster, token, "far/events")["events"]
        return [e for e in events if e["kind"] == "oom_killed"]

    (killed,) = _wait("an oom_killed event", oom)
    assert "ended a process" in killed["reason"]
    other = cluster.create_deployment("stranger")
    r = cluster.controls[0].api("GET", "/api/v1/sandboxes/far/metrics", other)
    assert (r.status_code, r.json()["code"]) == (404, "SANDBOX_NOT_FOUND")
    cluster.controls[0].api("DELETE", "/api/v1/sandboxes/far", token)


def test_the_console_stream_carries_the_nodes_newest_samples(cluster):
    """A control replica's ``/console/stream`` asks the node for its sandboxes'
    newest samples (one call per node per period) and sends them as ``metrics``."""
    token = cluster.create_deployment("streamed")
    r = cluster.controls[0].attach(token, "watched")
    assert r.status_code == 200, r.text
    base = cluster.url
    with httpx.Client(base_url=base, headers={"Origin": base}, timeout=60) as client:
        assert client.post("/console/session", json={"token": token}).status_code == 200
        seen: list[dict[str, Any]] = []
        with client.stream("GET", "/console/stream") as answer:
            event = None
            for line in answer.iter_lines():
                if line.startswith("event: "):
                    event = line[7:]
                elif line.startswith("data: ") and event == "metrics":
                    samples = json.loads(line[6:])["samples"]
                    if "watched" in samples:
                        seen.append(samples["watched"])
                        break
    own = _get(cluster, token, "watched/metrics")["samples"]
    assert seen[0] in own
    assert seen[0]["memory_bytes"] > 0
    cluster.controls[0].api("DELETE", "/api/v1/sandboxes/watched", token)
