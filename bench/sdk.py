"""SDK figures: 100 MiB up and down (MB/s, client memory) and exec p50 vs raw HTTP.

    .venv/bin/python bench/sdk.py                         # a real `podbay serve` it starts
    .venv/bin/python bench/sdk.py --server URL --token T  # an already running server

By default it starts a real ``podbay serve`` (``podbay.testing.platform``,
real sandboxes; needs root and the base image) in a CHILD process, so this
process's memory is the client's alone. Memory is the
peak RSS growth during each transfer (``/proc/self/clear_refs`` resets the
high-water mark) and tracemalloc's peak of Python allocations.

exec: the SDK's ``exec(["true"])`` against a raw ``httpx.Client.post`` to
the same endpoint with the same headers, interleaved, same connection pool
settings; the difference of the medians is the SDK's own cost.
"""

from __future__ import annotations

import hashlib
import json
import os
import statistics
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

import httpx

from podbay import SandboxClient
from podbay.testing.target import bench_arguments, bench_target

ROOT = Path(__file__).resolve().parent.parent
MIB = 1024 * 1024


def rss_reset() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def rss_peak_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


def rss_now_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def measure(label: str, size: int, action: Any) -> dict[str, Any]:
    rss_reset()
    base = rss_now_kib()
    started = time.perf_counter()
    action()
    seconds = time.perf_counter() - started
    growth = rss_peak_kib() - base
    tracemalloc.start()
    action()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    row = {
        "what": label,
        "mib": size / MIB,
        "seconds": round(seconds, 3),
        "mb_per_s": round(size / seconds / 1e6, 1),
        "rss_growth_mib": round(growth / 1024, 1),
        "python_peak_mib": round(peak / MIB, 2),
    }
    print(
        f"{label:10} {size / MIB:.0f} MiB in {seconds:.2f} s = {row['mb_per_s']} MB/s; "
        f"client RSS growth {row['rss_growth_mib']} MiB, Python peak "
        f"{row['python_peak_mib']} MiB"
    )
    return row


def digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(MIB):
            h.update(chunk)
    return h.hexdigest()


def exec_latency(client: SandboxClient, name: str, rounds: int) -> dict[str, Any]:
    handle = client.attach(name)
    url = handle.endpoint.rstrip("/") + "/v1/exec"
    body = {"command": ["true"], "timeout_ms": 29_000}
    raw_times, sdk_times = [], []
    with httpx.Client(timeout=30) as raw:
        for _ in range(20):  # warm both pools
            raw.post(url, json=body, headers=handle.headers).raise_for_status()
            client.exec(name, ["true"])
        for _ in range(rounds):
            t = time.perf_counter()
            raw.post(url, json=body, headers=handle.headers).raise_for_status()
            raw_times.append(time.perf_counter() - t)
            t = time.perf_counter()
            client.exec(name, ["true"])
            sdk_times.append(time.perf_counter() - t)
    raw_p50 = statistics.median(raw_times) * 1000
    sdk_p50 = statistics.median(sdk_times) * 1000
    print(
        f"exec p50   raw httpx {raw_p50:.2f} ms, SDK {sdk_p50:.2f} ms, "
        f"difference {sdk_p50 - raw_p50:+.2f} ms ({rounds} rounds each, interleaved)"
    )
    return {
        "raw_p50_ms": round(raw_p50, 3),
        "sdk_p50_ms": round(sdk_p50, 3),
        "difference_ms": round(sdk_p50 - raw_p50, 3),
        "rounds": rounds,
    }


def main() -> int:
    parser = bench_arguments(__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=300)
    args = parser.parse_args()
    local = "podbay serve (real oci sandbox, gateway, loopback)"
    name = f"bench-{os.getpid()}"
    with bench_target(args.server, args.token, local) as target:
        print(f"target: {target.description}")
        url, token = target.url, target.token
        with (
            SandboxClient(identity_token=token, server_url=url) as client,
            tempfile.TemporaryDirectory() as scratch,
        ):
            source = Path(scratch) / "up.bin"
            with open(source, "wb") as f:
                block = os.urandom(MIB)
                for i in range(args.mib):
                    f.write(block[i:] + block[:i])
            size = source.stat().st_size
            client.attach(name)
            up = measure("upload", size, lambda: client.upload(name, source, "bench.bin"))
            back = Path(scratch) / "down.bin"
            down = measure("download", size, lambda: client.download(name, "bench.bin", back))
            assert digest(back) == digest(source), "round trip changed the bytes"
            latency = exec_latency(client, name, args.rounds)
            client.delete(name)
        if args.json:
            report = {"target": target.description, "upload": up, "download": down}
            print(json.dumps({**report, "exec": latency}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
