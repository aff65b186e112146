"""What the console's data-plane proxy adds to an exec: the same ``true``
exec straight to the sandbox's endpoint with its credential (what an SDK
does) and through ``/console/sandboxes/{deployment}/{name}/v1/exec`` with a
session cookie (what the console's page does: the session's checks, an
attach, a minted credential, then the same gateway), interleaved one for one.

    .venv/bin/python bench/console_proxy.py [-n 200] [--json]

Starts its own ``podbay serve`` (real sandboxes, gVisor by default) in a
temporary directory and prints the medians, p90s and the difference of medians.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from podbay.testing.platform import PlatformServer


def _ms(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "p50_ms": round(statistics.median(ordered) * 1000, 2),
        "p90_ms": round(ordered[int(len(ordered) * 0.9)] * 1000, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", type=int, default=200, help="execs of each kind")
    parser.add_argument("--json", action="store_true", help="print JSON")
    args = parser.parse_args()
    with (
        tempfile.TemporaryDirectory(prefix="podbay-bench-console-") as root,
        PlatformServer.start(Path(root)) as server,
    ):
        token = server.create_deployment("bench")
        while (attached := server.attach(token, "bench")).status_code == 503:
            time.sleep(1)
        handle = attached.json()
        page = httpx.Client(
            base_url=server.base_url, timeout=60, headers={"Origin": server.base_url}
        )
        csrf = page.post("/console/session", json={"token": token}).json()["csrf"]
        direct = httpx.Client(timeout=60, headers=handle["headers"])
        body = {"command": ["true"]}
        through = "/console/sandboxes/bench/bench/v1/exec"
        times: dict[str, list[float]] = {"direct": [], "console": []}
        for i in range(args.n + 10):  # the first 10 of each warm up
            for kind in ("direct", "console"):
                started = time.perf_counter()
                if kind == "direct":
                    r = direct.post(handle["endpoint"] + "/v1/exec", json=body)
                else:
                    r = page.post(through, json=body, headers={"X-CSRF-Token": csrf})
                took = time.perf_counter() - started
                assert r.status_code == 200, r.text
                assert r.json()["exit_code"] == 0, r.text
                if i >= 10:
                    times[kind].append(took)
        result = {kind: _ms(samples) for kind, samples in times.items()}
        result["added_p50_ms"] = round(result["console"]["p50_ms"] - result["direct"]["p50_ms"], 2)
        result["n"] = args.n
        server.api("DELETE", "/api/v1/sandboxes/bench", token)
    if args.json:
        print(json.dumps(result))
    else:
        for kind in ("direct", "console"):
            print(f"{kind:8} p50 {result[kind]['p50_ms']} ms  p90 {result[kind]['p90_ms']} ms")
        print(f"added by the console's proxy (p50): {result['added_p50_ms']} ms, n={args.n}")


if __name__ == "__main__":
    main()
