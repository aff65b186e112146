"""Soak: mixed load on a real ``podbay serve`` for a given time, sampling what leaks.

    .venv/bin/python bench/soak.py --duration 600 [--workers 6] [--sandboxes 6]
                                   [--interval 10] [--json]

Workers loop over a mix of what agents and attackers do: attach, exec,
spawn + poll + kill, native file write + read, list and get, stop (the next
attach resumes), plus hostile requests (deep JSON, a lone surrogate, an
oversized body, a half-sent request left to time out, a client dropping
mid-body). Every ``--interval`` seconds the server process is sampled: RSS,
open descriptors, threads, and the sandboxes in its store.

What to look for: RSS, descriptors and threads flat after warm-up (the
summary prints first-quarter and last-quarter medians and their drift), no
5xx (hostile requests must get 4xx), sandboxes never above ``--sandboxes``.
The last line is the verdict (:func:`verdict`): ``flat`` or what grew.

Warm-up is real: the gateway caches up to 4096 verified credentials (one per
attach, ~250 bytes each), so RSS climbs about 1 MiB until that many attaches
happened, then stays. Compare after warm-up, or run long enough to see the
plateau.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import socket
import sqlite3
import statistics
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from podbay.testing.platform import PlatformServer


def sample(server: PlatformServer) -> dict[str, Any]:
    pid = server.pid()
    status = Path(f"/proc/{pid}/status").read_text()
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    db = sqlite3.connect(f"file:{server.data_dir / 'podbay.db'}?mode=ro", uri=True, timeout=30)
    try:
        states = Counter(s for (s,) in db.execute("SELECT state FROM sandboxes"))
    finally:
        db.close()
    return {
        "t": time.time(),
        "rss_mib": int(fields["VmRSS"].split()[0]) / 1024,
        "fds": len(os.listdir(f"/proc/{pid}/fd")),
        "threads": int(fields["Threads"]),
        "sandboxes": sum(states.values()),
        "running": states.get("running", 0),
    }


class Worker:
    def __init__(
        self,
        server: PlatformServer,
        token: str,
        names: list[str],
        statuses: Counter[int],
        stop: threading.Event,
        seed: int,
    ) -> None:
        self.server = server
        self.token = token
        self.names = names
        self.statuses = statuses
        self.stop = stop
        self.rng = random.Random(seed)
        self.http = httpx.Client(timeout=120)
        self.handles: dict[str, dict[str, Any]] = {}

    def record(self, r: httpx.Response) -> httpx.Response:
        self.statuses[r.status_code] += 1
        return r

    def handle(self, name: str) -> dict[str, Any]:
        if name not in self.handles:
            r = self.record(self.server.attach(self.token, name))
            self.handles[name] = r.json()
        return self.handles[name]

    def data(self, name: str, method: str, path: str, **kw: Any) -> httpx.Response:
        h = self.handle(name)
        r = self.http.request(
            method, h["endpoint"] + path, headers={**h["headers"], **kw.pop("headers", {})}, **kw
        )
        if r.status_code == 401:  # suspended by a 'stop' step: attach again, once
            self.handles.pop(name, None)
            h = self.handle(name)
            r = self.http.request(method, h["endpoint"] + path, headers=h["headers"], **kw)
        return self.record(r)

    def step(self) -> None:
        name = self.rng.choice(self.names)
        kind = self.rng.choices(
            ["exec", "spawn", "files", "list", "stop", "hostile", "slow"],
            weights=[40, 10, 15, 15, 3, 15, 2],
        )[0]
        if kind == "exec":
            self.data(name, "POST", "/v1/exec", json={"command": ["sh", "-c", "echo $$"]})
        elif kind == "spawn":
            r = self.data(
                name,
                "POST",
                "/v1/processes",
                json={"command": ["sh", "-c", "seq 1 2000; sleep 0.2"]},
            )
            if r.status_code == 200:
                pid = r.json()["process_id"]
                time.sleep(0.3)
                self.data(name, "GET", f"/v1/processes/{pid}")
                self.data(name, "DELETE", f"/v1/processes/{pid}")
        elif kind == "files":
            body = os.urandom(self.rng.choice([100, 64 * 1024, 1024 * 1024]))
            path = f"/workspace/soak-{self.rng.randrange(8)}"
            self.data(
                name,
                "PUT",
                "/v1/files",
                params={"path": path},
                content=body,
                headers={"X-Podbay-Sha256": hashlib.sha256(body).hexdigest()},
            )
            self.data(name, "GET", "/v1/files", params={"path": path})
        elif kind == "list":
            self.record(self.server.api("GET", "/api/v1/sandboxes", self.token))
            self.record(self.server.api("GET", f"/api/v1/sandboxes/{name}", self.token))
        elif kind == "stop":
            self.record(self.server.api("POST", f"/api/v1/sandboxes/{name}/stop", self.token))
            self.handles.pop(name, None)
        elif kind == "hostile":
            self.hostile(name)
        else:
            self.half_sent()

    def hostile(self, name: str) -> None:
        choice = self.rng.randrange(4)
        if choice == 0:
            self.data(
                name, "POST", "/v1/exec", content=b'{"command":' + b"[" * 5000 + b"]" * 5000 + b"}"
            )
        elif choice == 1:
            self.data(
                name, "POST", "/v1/exec", content=b'{"command":["true"],"env":{"\\ud800":"x"}}'
            )
        elif choice == 2:
            self.data(name, "POST", "/v1/exec", content=b"[" * (9 * 1024 * 1024))
        else:
            self.record(self.server.attach(self.token, name, content=b"{" * (128 * 1024)))

    def half_sent(self) -> None:
        """A request that stops halfway and a client that drops mid-body."""
        with socket.create_connection(("127.0.0.1", self.server.port), timeout=60) as sock:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        with socket.create_connection(("127.0.0.1", self.server.port), timeout=60) as sock:
            sock.sendall(
                b"PUT /api/v1/sandboxes/x HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{"
            )

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                self.step()
            except httpx.HTTPError:
                self.statuses[-1] += 1  # transport error
        self.http.close()


def quarter_medians(samples: list[dict[str, Any]], key: str) -> tuple[float, float]:
    n = max(1, len(samples) // 4)
    return (
        statistics.median(s[key] for s in samples[:n]),
        statistics.median(s[key] for s in samples[-n:]),
    )


#: Allowed rise after warm-up: RSS (MiB, or this fraction of the start) and
#: descriptors/threads (count), median of the last quarter against the second.
RSS_SLACK_MIB, RSS_SLACK_FRACTION, COUNT_SLACK = 1.5, 0.02, 2


def verdict(samples: list[dict[str, Any]]) -> str:
    """``flat``, or which of RSS, descriptors and threads kept rising after
    warm-up (the first quarter), comparing the medians of the second and the
    last quarter: a leak rises in both halves, warm-up only in the first."""
    n = max(1, len(samples) // 4)
    second, last = samples[n : 2 * n] or samples[:n], samples[-n:]
    grew = []
    for key in ("rss_mib", "fds", "threads"):
        before = statistics.median(s[key] for s in second)
        after = statistics.median(s[key] for s in last)
        slack = max(RSS_SLACK_MIB, RSS_SLACK_FRACTION * before) if key == "rss_mib" else COUNT_SLACK
        if after - before > slack:
            grew.append(f"{key} {before:g} -> {after:g}")
    return "flat" if not grew else "GROWING: " + ", ".join(grew)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=600, help="seconds of load")
    parser.add_argument("--workers", type=int, default=6)
    parser.add_argument("--sandboxes", type=int, default=6)
    parser.add_argument("--interval", type=float, default=10, help="seconds between samples")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()

    with (
        tempfile.TemporaryDirectory(prefix="podbay-soak-") as tmp,
        PlatformServer.start(
            Path(tmp),
            env={
                "PODBAY_CAPS_PER_DEPLOYMENT": str(args.sandboxes),
                "PODBAY_SERVER_HEAD_TIMEOUT_SECONDS": "5",
                "PODBAY_SERVER_BODY_TIMEOUT_SECONDS": "5",
            },
        ) as server,
    ):
        token = server.create_deployment("soak")
        names = [f"soak-{i}" for i in range(args.sandboxes)]
        for name in names:
            server.attach(token, name).raise_for_status()
        stop = threading.Event()
        statuses: Counter[int] = Counter()
        workers = [
            Worker(server, token, names, statuses, stop, seed=i) for i in range(args.workers)
        ]
        threads = [threading.Thread(target=w.run, daemon=True) for w in workers]
        samples = [sample(server)]
        started = time.monotonic()
        for t in threads:
            t.start()
        while time.monotonic() - started < args.duration:
            time.sleep(min(args.interval, max(0.0, args.duration - (time.monotonic() - started))))
            samples.append(sample(server))
            if not args.json:
                s = samples[-1]
                print(
                    f"{time.monotonic() - started:7.0f}s rss {s['rss_mib']:7.1f} MiB  "
                    f"fds {s['fds']:4d}  threads {s['threads']:3d}  "
                    f"sandboxes {s['sandboxes']} ({s['running']} running)  "
                    f"requests {sum(statuses.values())}",
                    flush=True,
                )
        stop.set()
        for t in threads:
            t.join(180)
        time.sleep(max(args.interval, 6))  # half-sent requests time out, pools settle
        samples.append(sample(server))
        tracebacks = server.log_path.read_text().count("Traceback")

    result: dict[str, Any] = {
        "duration_s": args.duration,
        "workers": args.workers,
        "sandboxes": args.sandboxes,
        "requests": sum(statuses.values()),
        "statuses": {str(k): v for k, v in sorted(statuses.items())},
        "server_5xx": sum(v for k, v in statuses.items() if k >= 500),
        "tracebacks_logged": tracebacks,
        "samples": len(samples),
    }
    for key in ("rss_mib", "fds", "threads"):
        first, last = quarter_medians(samples, key)
        result[key] = {
            "first_quarter_median": first,
            "last_quarter_median": last,
            "max": max(s[key] for s in samples),
            "after_idle": samples[-1][key],
        }
    result["max_sandboxes"] = max(s["sandboxes"] for s in samples)
    result["verdict"] = verdict(samples[:-1])  # the idle sample after the load is not load
    print(json.dumps(result, indent=None if args.json else 2))
    if not args.json:
        print(f"verdict: {result['verdict']}")


if __name__ == "__main__":
    main()
