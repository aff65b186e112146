"""The cluster's figures, one run on one machine: single-host ``podbay serve``
first, then PostgreSQL + two ``podbay control`` behind haproxy + three
``podbay node`` (``podbay.testing.cluster.LocalCluster``), real sandboxes.

    .venv/bin/python bench/cluster.py [--rounds 30] [--json]

* attach p50 of a new and of a running sandbox, and exec (``true``) p50 through
  the gateway: serve vs the cluster (attach through haproxy and a control
  replica, exec straight to the node holding the sandbox)
* 50 concurrent first attaches of one name, half to each control replica
  directly: how many sandboxes result (must be 1)
* ``kill -9`` of one control replica while 8 workers attach new sandboxes
  through haproxy: what the clients saw (a 502/503/504 or a cut connection is
  retryable: attach is idempotent by name), then sandboxes lost or duplicated
  (names vs the store vs machines on the nodes)
* ``kill -9`` of a node: seconds until each of its sandboxes is reported lost
  (``cluster.node_lost_seconds`` here is 5), and whether the other nodes'
  sandboxes still answer

Needs root, runc and the base image (as the suite).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import statistics
import tempfile
import threading
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from podbay.testing.cluster import LocalCluster
from podbay.testing.platform import PlatformServer

RETRYABLE_STATUS = {502, 503, 504}


def p50_ms(samples: list[float]) -> float:
    return round(statistics.median(samples) * 1000, 2)


def attach(http: httpx.Client, url: str, token: str, name: str) -> httpx.Response:
    return http.put(f"{url}/api/v1/sandboxes/{name}", headers={"Authorization": f"Bearer {token}"})


def exec_true(http: httpx.Client, handle: dict[str, Any]) -> httpx.Response:
    return http.post(
        handle["endpoint"] + "/v1/exec", headers=handle["headers"], json={"command": ["true"]}
    )


def timed(call: Any) -> tuple[float, httpx.Response]:
    start = time.perf_counter()
    response = call()
    return time.perf_counter() - start, response


def speeds(url: str, token: str, rounds: int) -> dict[str, float]:
    """Attach new, attach running, exec: p50 ms over ``rounds`` each."""
    new, running, execs = [], [], []
    with httpx.Client(timeout=120) as http:
        handles = []
        for _ in range(max(5, rounds // 3)):
            elapsed, r = timed(lambda: attach(http, url, token, f"b-{uuid.uuid4().hex[:8]}"))
            assert r.status_code == 200, r.text
            new.append(elapsed)
            handles.append(r.json())
        name = handles[0]["name"]
        for _ in range(rounds):
            elapsed, r = timed(lambda: attach(http, url, token, name))
            assert r.status_code == 200, r.text
            running.append(elapsed)
        handle = handles[0]
        for _ in range(5):  # connection and agent warm
            exec_true(http, handle)
        for _ in range(rounds * 3):
            elapsed, r = timed(lambda: exec_true(http, handle))
            assert r.status_code == 200 and r.json()["exit_code"] == 0, r.text
            execs.append(elapsed)
        for h in handles:
            http.delete(
                f"{url}/api/v1/sandboxes/{h['name']}", headers={"Authorization": f"Bearer {token}"}
            )
    return {
        "attach_new_p50_ms": p50_ms(new),
        "attach_running_p50_ms": p50_ms(running),
        "exec_p50_ms": p50_ms(execs),
    }


def concurrent_first_attach(cluster: LocalCluster, token: str, n: int = 50) -> dict[str, Any]:
    name = f"race-{uuid.uuid4().hex[:8]}"
    machines_before = machines_total(cluster)
    urls = [c.base_url for c in cluster.controls]
    barrier = threading.Barrier(n)

    def one(i: int) -> httpx.Response:
        with httpx.Client(timeout=120) as http:
            barrier.wait()
            return attach(http, urls[i % len(urls)], token, name)

    with concurrent.futures.ThreadPoolExecutor(n) as pool:
        answers = list(pool.map(one, range(n)))
    statuses = Counter(r.status_code for r in answers)
    endpoints = {r.json()["endpoint"] for r in answers if r.status_code == 200}
    starts = Counter(r.json().get("start") for r in answers if r.status_code == 200)
    return {
        "attaches": n,
        "statuses": dict(statuses),
        "distinct_sandboxes": len(endpoints),
        "starts": dict(starts),
        "machines_added_on_nodes": machines_total(cluster) - machines_before,
    }


def machines_total(cluster: LocalCluster) -> int:
    """Machines the nodes hold (container class: ``machines/<id>/machine.json``)."""
    return sum(
        1 for node in cluster.nodes for _ in (node.data_dir / "machines").glob("*/machine.json")
    )


def listed(url: str, token: str) -> list[dict[str, Any]]:
    r = httpx.get(
        f"{url}/api/v1/sandboxes", headers={"Authorization": f"Bearer {token}"}, timeout=60
    )
    r.raise_for_status()
    body = r.json()
    return list(body["sandboxes"] if isinstance(body, dict) else body)


def kill_control_under_load(
    cluster: LocalCluster, token: str, workers: int = 8, seconds: float = 6.0
) -> dict[str, Any]:
    """Workers attach new names through haproxy; one replica is killed midway.
    A retryable answer is retried (same name) until it succeeds."""
    machines_before = machines_total(cluster)
    seen: Counter[str] = Counter()
    names: list[str] = []
    lock = threading.Lock()
    stop_at = time.monotonic() + seconds

    def work() -> None:
        with httpx.Client(timeout=120) as http:
            while time.monotonic() < stop_at:
                name = f"k-{uuid.uuid4().hex[:8]}"
                for _ in range(20):
                    try:
                        r = attach(http, cluster.url, token, name)
                        kind = (
                            "ok"
                            if r.status_code == 200
                            else (
                                f"retryable {r.status_code}"
                                if r.status_code in RETRYABLE_STATUS
                                else f"NOT RETRYABLE {r.status_code} {r.text[:120]}"
                            )
                        )
                    except httpx.TransportError as exc:
                        kind = f"retryable {type(exc).__name__}"
                    with lock:
                        seen[kind] += 1
                    if kind == "ok":
                        with lock:
                            names.append(name)
                        break
                    if kind.startswith("NOT"):
                        break
                    time.sleep(0.2)

    threads = [threading.Thread(target=work) for _ in range(workers)]
    for t in threads:
        t.start()
    time.sleep(seconds / 3)
    victim = cluster.controls[1]
    victim.kill9()
    killed_at = time.monotonic()
    for t in threads:
        t.join()
    sandboxes = [s for s in listed(cluster.url, token) if s["name"] in set(names)]
    by_name = Counter(s["name"] for s in sandboxes)
    return {
        "answers": dict(seen),
        "sandboxes_attached": len(names),
        "lost": len(set(names) - set(by_name)),
        "duplicated_in_store": sum(c - 1 for c in by_name.values()),
        "machines_added_on_nodes": machines_total(cluster) - machines_before,
        "seconds_after_kill": round(stop_at - killed_at, 1),
    }


def kill_node(cluster: LocalCluster, token: str, per_node: int = 2) -> dict[str, Any]:
    """New sandboxes until every live node holds ``per_node`` (or placement
    stops spreading them), then one node is killed."""
    handles: list[dict[str, Any]] = []
    live = [n for n in cluster.nodes if n.process is not None and n.process.poll() is None]

    def short() -> bool:
        held = Counter(cluster.node_for(h["endpoint"]).root.name for h in handles)
        return any(held[n.root.name] < per_node for n in live)

    with httpx.Client(timeout=120) as http:
        while short() and len(handles) < 4 * per_node * len(live):
            r = attach(http, cluster.url, token, f"n-{uuid.uuid4().hex[:8]}")
            assert r.status_code == 200, r.text
            handles.append(r.json())
        victim = cluster.node_for(handles[0]["endpoint"])
        on_victim = [h for h in handles if cluster.node_for(h["endpoint"]) is victim]
        others = [h for h in handles if cluster.node_for(h["endpoint"]) is not victim]
        victim.kill9()
        killed = time.monotonic()
        reported: dict[str, float] = {}
        answers: dict[str, str] = {}
        while len(reported) < len(on_victim) and time.monotonic() - killed < 120:
            for h in on_victim:
                if h["name"] in reported:
                    continue
                r = http.get(
                    f"{cluster.url}/api/v1/sandboxes/{h['name']}",
                    headers={"Authorization": f"Bearer {token}"},
                )
                if r.status_code == 200 and r.json().get("state") == "lost":
                    reported[h["name"]] = time.monotonic() - killed
                    a = attach(http, cluster.url, token, h["name"])
                    answers[h["name"]] = f"{a.status_code} {a.json().get('code')}"
            time.sleep(0.1)
        others_fine = sum(
            1
            for h in others
            if exec_true(http, h).status_code == 200
            and attach(http, cluster.url, token, h["name"]).status_code == 200
        )
    return {
        "sandboxes_on_killed_node": len(on_victim),
        "reported_lost": len(reported),
        "seconds_to_lost_max": round(max(reported.values()), 1) if reported else None,
        "attach_of_a_lost_sandbox": sorted(set(answers.values())),
        "other_sandboxes_answering": f"{others_fine}/{len(others)}",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="podbay-bench-cluster-") as tmp:
        root = Path(tmp)
        with PlatformServer.start(root / "serve") as serve:
            token = serve.create_deployment("bench")
            results["serve"] = speeds(serve.base_url, token, args.rounds)
        with LocalCluster.start(root / "cluster") as cluster:
            token = cluster.create_deployment("bench")
            results["cluster"] = speeds(cluster.url, token, args.rounds)
            results["exec_difference_ms"] = round(
                results["cluster"]["exec_p50_ms"] - results["serve"]["exec_p50_ms"], 2
            )
            results["concurrent_first_attach"] = concurrent_first_attach(cluster, token)
            results["kill_control"] = kill_control_under_load(cluster, token)
            results["kill_node"] = kill_node(cluster, token)
    if args.json:
        print(json.dumps(results, indent=2))
        return
    for key, value in results.items():
        print(f"{key}: {json.dumps(value)}")


if __name__ == "__main__":
    main()
