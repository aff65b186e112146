"""Moving a stopped sandbox's disk between nodes: how long, and that the
control plane carries none of it. PostgreSQL + two ``podbay control``
behind haproxy + two ``podbay node`` (``podbay.testing.local_cluster.LocalCluster``).

    .venv/bin/python bench/cluster_moves.py [--mib 100] [--moves 6] [--json]

One sandbox gets ``--mib`` MiB of random data in ``/workspace``; ``podbay
node drain --evict`` of its node stops it and moves it to the other node,
then the two nodes take turns being drained, so the same disk moves back and
forth ``--moves`` times. Per move: seconds (as ``drain`` reports them: the
target's environment, the node-to-node stream with both SHA-256s, the row's
compare-and-set, the source's copy destroyed), bytes sent, and the I/O
(``rchar`` + ``wchar``) of each control replica over the whole drain.

Needs root, runc and the base image (as the suite).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from podbay.testing.local_cluster import LocalCluster, process_io

LONG = {
    "PODBAY_LIFECYCLE_IDLE_SECONDS": "3600",
    "PODBAY_LIFECYCLE_MAX_AGE_SECONDS": "36000",
    "PODBAY_LIFECYCLE_SUSPENDED_TTL_SECONDS": "36000",
}


def control_io(cluster: LocalCluster) -> list[int]:
    return [sum(process_io(c.pid())[k] for k in ("rchar", "wchar")) for c in cluster.controls]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mib", type=int, default=100)
    parser.add_argument("--moves", type=int, default=6)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with (
        tempfile.TemporaryDirectory(prefix="podbay-moves-") as tmp,
        LocalCluster.start(Path(tmp), nodes=2, env=LONG) as cluster,
    ):
        token = cluster.create_deployment("move-bench")
        handle = httpx.put(
            f"{cluster.url}/api/v1/sandboxes/m",
            headers={"Authorization": f"Bearer {token}"},
            timeout=120,
        ).json()
        r = httpx.post(
            handle["endpoint"] + "/v1/exec",
            headers=handle["headers"],
            json={
                "command": [
                    "/bin/sh",
                    "-c",
                    f"head -c {args.mib * 1048576} /dev/urandom > /workspace/big && sync",
                ]
            },
            timeout=600,
        )
        assert r.json()["exit_code"] == 0, r.text
        node = cluster.node_for(handle["endpoint"]).env["PODBAY_NODE_NAME"]
        moves: list[dict[str, Any]] = []
        for i in range(args.moves):
            before = control_io(cluster)
            started = time.monotonic()
            out = cluster.cli(
                "node", "drain", node, "--json", *(["--evict"] if i == 0 else []), timeout=900
            )
            wall = time.monotonic() - started
            after = control_io(cluster)
            (moved,) = json.loads(out.stdout)["moved"]
            cluster.cli("node", "undrain", node)
            moves.append(
                {
                    "from": node,
                    "to": moved["to"],
                    "bytes": moved["bytes"],
                    "seconds": moved["seconds"],
                    "MB_per_s": round(moved["bytes"] / moved["seconds"] / 1e6, 1),
                    "drain_command_seconds": round(wall, 2),
                    "control_io_bytes": [a - b for a, b in zip(after, before, strict=True)],
                }
            )
            node = moved["to"]
        seconds = [m["seconds"] for m in moves]
        result = {
            "mib": args.mib,
            "moves": moves,
            "seconds_p50": round(statistics.median(seconds), 2),
            "seconds_min": min(seconds),
            "seconds_max": max(seconds),
            "control_io_max_bytes": max(max(m["control_io_bytes"]) for m in moves),
        }
    if args.json:
        print(json.dumps(result, indent=1))
        return
    for m in moves:
        print(
            f"{m['from']} -> {m['to']}: {m['bytes']} bytes in {m['seconds']:.2f} s "
            f"({m['MB_per_s']} MB/s); control replicas' I/O {m['control_io_bytes']} bytes"
        )
    print(
        f"p50 {result['seconds_p50']} s (min {result['seconds_min']}, max "
        f"{result['seconds_max']}); control I/O at most {result['control_io_max_bytes']} bytes"
    )


if __name__ == "__main__":
    main()
