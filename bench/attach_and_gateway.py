"""Attach and gateway figures, one run, against a real ``podbay serve`` and real sandboxes.

    .venv/bin/python bench/attach_and_gateway.py [--warm-pool N] [--json]

* attach of a new sandbox (p50, p99), one at a time and in a burst of 10
* attach of a running sandbox
* attach that resumes a suspended sandbox
* exec round trip through gateway and agent, beside the agent alone (its socket)
* exec throughput across 20 sandboxes on this machine

Targets: new attach p50 <= 200 ms (a new conversation's first command waits
for it), running attach p50 <= 5 ms (agents attach on every turn), exec round
trip p50 <= 5 ms (what the platform adds to every command).
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import json
import os
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from podbay.testing.platform import PlatformServer


def pct(samples: list[float], p: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def summary(samples: list[float]) -> dict[str, float]:
    ms = [s * 1000 for s in samples]
    return {
        "n": len(ms),
        "p50_ms": round(statistics.median(ms), 2),
        "p99_ms": round(pct(ms, 99), 2),
        "mean_ms": round(statistics.fmean(ms), 2),
    }


def timed(fn) -> float:  # type: ignore[no-untyped-def]
    t = time.perf_counter()
    r = fn()
    elapsed = time.perf_counter() - t
    assert r.status_code in (200, 204), r.text
    return elapsed


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def agent_socket(server: PlatformServer, endpoint: str) -> Path:
    from podbay.runtime.oci.driver import OciDriver
    from podbay.settings import Settings

    sandbox_id = endpoint.rsplit("/", 1)[1]
    with sqlite3.connect(server.data_dir / "podbay.db") as db:
        (machine_id,) = db.execute(
            "SELECT machine_id FROM sandboxes WHERE id=?", (sandbox_id,)
        ).fetchone()
    settings = Settings.load(environ={**server.env}, data_dir=server.data_dir)
    return OciDriver(settings).agent_socket(machine_id)


async def throughput(server: PlatformServer, handles: list[dict], seconds: float) -> float:
    count = 0
    stop_at = time.perf_counter() + seconds
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    async with httpx.AsyncClient(timeout=30, limits=limits) as client:

        async def loop(h: dict) -> None:
            nonlocal count
            while time.perf_counter() < stop_at:
                r = await client.post(
                    h["endpoint"] + "/v1/exec", headers=h["headers"], json={"command": ["true"]}
                )
                assert r.status_code == 200, r.text
                count += 1

        await asyncio.gather(*(loop(h) for h in handles))
    return count / seconds


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--warm-pool", type=int, default=2)
    parser.add_argument("--new", type=int, default=40, help="new-sandbox attaches")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results: dict[str, object] = {"warm_pool": args.warm_pool}
    root = Path(tempfile.mkdtemp(prefix="podbay-bench-"))
    env = {
        "PODBAY_RUNTIME_WARM_POOL": str(args.warm_pool),
        "PODBAY_CAPS_PER_DEPLOYMENT": "100",
        "PODBAY_CAPS_PER_ACCOUNT": "100",
        "PODBAY_LOG_LEVEL": "warning",
    }
    with PlatformServer.start(root, env=env) as server:
        token = server.create_deployment("bench")
        http = server.http

        # -- new sandboxes: one at a time, with a pause so a warm pool can refill
        new = []
        for i in range(args.new):
            new.append(timed(lambda i=i: server.attach(token, f"new-{i}")))
            server.api("DELETE", f"/api/v1/sandboxes/new-{i}", token)
            time.sleep(0.3 if args.warm_pool else 0.05)
        if new:
            results["attach_new"] = summary(new)

        # -- a burst: 10 new sandboxes at once (drains a small pool)
        with concurrent.futures.ThreadPoolExecutor(10) as burst:
            times = list(
                burst.map(lambda i: timed(lambda: server.attach(token, f"burst-{i}")), range(10))
            )
        results["attach_new_burst_of_10"] = summary(times)
        for i in range(10):
            server.api("DELETE", f"/api/v1/sandboxes/burst-{i}", token)

        h = server.attach(token, "hot").json()
        for _ in range(20):
            server.attach(token, "hot")
        results["attach_running"] = summary(
            [timed(lambda: server.attach(token, "hot")) for _ in range(300)]
        )

        resumed = []
        for _ in range(30):
            assert server.api("POST", "/api/v1/sandboxes/hot/stop", token).status_code == 204
            resumed.append(timed(lambda: server.attach(token, "hot")))
        results["attach_resume"] = summary(resumed)

        h = server.attach(token, "hot").json()
        body = {"command": ["true"]}
        for _ in range(50):
            http.post(h["endpoint"] + "/v1/exec", headers=h["headers"], json=body)
        results["exec_gateway"] = summary(
            [
                timed(
                    lambda: http.post(h["endpoint"] + "/v1/exec", headers=h["headers"], json=body)
                )
                for _ in range(500)
            ]
        )
        sock = agent_socket(server, h["endpoint"])
        with httpx.Client(
            transport=httpx.HTTPTransport(uds=str(sock)), base_url="http://agent"
        ) as direct:
            for _ in range(50):
                direct.post("/v1/exec", json=body)
            results["exec_agent_only"] = summary(
                [timed(lambda: direct.post("/v1/exec", json=body)) for _ in range(500)]
            )

        handles = [server.attach(token, f"tp-{i}").json() for i in range(20)]
        cpu_before = cpu_seconds(server.pid())
        rate = asyncio.run(throughput(server, handles, 10.0))
        results["exec_throughput_20_sandboxes_per_s"] = round(rate, 1)
        results["serve_cpu_ms_per_exec"] = round(
            (cpu_seconds(server.pid()) - cpu_before) * 1000 / (rate * 10.0), 3
        )
        rss = {}
        for line in Path(f"/proc/{server.pid()}/status").read_text().splitlines():
            if line.startswith(("VmRSS", "VmHWM")):
                rss[line.split(":")[0]] = line.split()[1] + " kB"
        results["serve_memory"] = rss
    if args.json:
        print(json.dumps(results, indent=2))
        return
    for key, value in results.items():
        print(f"{key:40} {value}")


if __name__ == "__main__":
    main()
