"""Code interpreter figures: ``run_code("1+1")`` on a warm interpreter, p50/p90.

    .venv/bin/python bench/interpreter.py                         # starts a real `podbay serve`
    .venv/bin/python bench/interpreter.py --server URL --token T  # an already running server

The interpreter's kernel runs inside the sandbox and is reached through the
gateway's port relay, so each cell is one HTTP request client -> gateway ->
agent tunnel -> kernel. Interleaved with it, for the floor: a raw
``httpx`` GET of the kernel's ``/health`` through the same relay (no cell
run), and the SDK's ``exec(["true"])`` (a new process per call).
"""

from __future__ import annotations

import json
import statistics
import time
import uuid
from collections.abc import Callable

import httpx

from podbay import SandboxClient
from podbay.client import _interpreter
from podbay.testing.target import bench_arguments, bench_target


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def timed(action: Callable[[], object]) -> float:
    started = time.perf_counter()
    action()
    return (time.perf_counter() - started) * 1000


def main() -> int:
    parser = bench_arguments(__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=300)
    args = parser.parse_args()
    name = f"bench-interp-{uuid.uuid4().hex[:6]}"
    with (
        bench_target(args.server, args.token, "podbay serve (local)") as target,
        SandboxClient(identity_token=target.token, server_url=target.url) as client,
    ):
        sb = client.sandbox(name)
        started = time.perf_counter()
        assert sb.run_code("1+1").text == "2"
        cold_ms = (time.perf_counter() - started) * 1000
        token_file = sb.read_file(_interpreter.TOKEN_FILE).strip()
        health_url = sb.url(_interpreter.KERNEL_PORT, "/health")
        samples: dict[str, list[float]] = {"run_code": [], "relay_floor": [], "exec": []}
        with httpx.Client(transport=sb.port_transport()) as http:
            headers = {_interpreter.TOKEN_HEADER: token_file}
            for _ in range(20):  # warm both paths' connections
                sb.run_code("1+1")
                http.get(health_url, headers=headers)
            for _ in range(args.rounds):
                samples["run_code"].append(timed(lambda: sb.run_code("1+1")))
                samples["relay_floor"].append(timed(lambda: http.get(health_url, headers=headers)))
            for _ in range(min(args.rounds, 100)):
                samples["exec"].append(timed(lambda: sb.exec(["true"])))
        client.delete(name)
    rows = {"cold_start_ms": round(cold_ms, 1)}
    for label, values in samples.items():
        rows[f"{label}_p50_ms"] = round(statistics.median(values), 2)
        rows[f"{label}_p90_ms"] = round(percentile(values, 0.9), 2)
    if args.json:
        print(json.dumps(rows))
    else:
        print(f"first run_code (uploads and starts the kernel): {rows['cold_start_ms']} ms")
        for label in samples:
            print(
                f"{label:12} p50 {rows[f'{label}_p50_ms']:7.2f} ms   "
                f"p90 {rows[f'{label}_p90_ms']:7.2f} ms   ({len(samples[label])} samples)"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
