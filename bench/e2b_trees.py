"""E2B's SDK against two podbay source trees at once, interleaved: a change's
before and after under the same load (absolute figures follow the load).

    .venv/bin/python bench/e2b_trees.py --before /path/to/main/src --after src [--rounds N]

One ``podbay serve`` per tree, each with an E2B sandbox and a podbay one;
each round runs every operation through E2B's SDK on both servers (their
order alternating), then through podbay's SDK on the ``after`` server (the
reference the ratios divide by): ``run`` is ``commands.run("true")`` against
``exec(["/bin/bash", "-l", "-c", "true"])`` (what the SDK runs), ``write`` /
``read`` 10 MiB, ``run_code("1+1")``. Medians.
"""

from __future__ import annotations

import argparse
import importlib
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

# This script's directory holds e2b.py: it must not shadow the SDK.
_HERE = Path(__file__).resolve().parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _HERE]

from e2b_code_interpreter import Sandbox as InterpreterSandbox  # noqa: E402

from podbay import SandboxClient  # noqa: E402
from podbay.testing.platform import PlatformServer  # noqa: E402

importlib.import_module("e2b")
PAYLOAD = os.urandom(10 * 1024 * 1024)
E2B_OPS: dict[str, Callable[[Any], object]] = {
    "run": lambda sb: sb.commands.run("true"),
    "write": lambda sb: sb.files.write("/tmp/bench.bin", PAYLOAD),
    "read": lambda sb: sb.files.read("/tmp/bench.bin", format="bytes"),
    "run_code": lambda sb: sb.run_code("1+1"),
}
NATIVE_OPS: dict[str, Callable[[Any], object]] = {
    "run": lambda sb: sb.exec(["/bin/bash", "-l", "-c", "true"]),
    "write": lambda sb: sb.write_file_bytes("/tmp/bench.bin", PAYLOAD),
    "read": lambda sb: sb.read_file_bytes("/tmp/bench.bin"),
    "run_code": lambda sb: sb.run_code("1+1"),
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="the src directory of the old tree")
    parser.add_argument("--after", required=True, help="the src directory of the new tree")
    parser.add_argument("--rounds", type=int, default=20)
    args = parser.parse_args()
    trees = {"before": str(Path(args.before).resolve()), "after": str(Path(args.after).resolve())}
    servers: dict[str, PlatformServer] = {}
    e2b_boxes: dict[str, Any] = {}
    clients: list[SandboxClient] = []
    native: Any = None
    samples: dict[tuple[str, str], list[float]] = {}
    try:
        for name, tree in trees.items():
            root = Path(tempfile.mkdtemp(prefix=f"podbay-bench-trees-{name}-"))
            server = PlatformServer.start(root, env={**os.environ, "PYTHONPATH": tree})
            servers[name] = server
            token = server.create_deployment("bench")
            key = server.cli("deployment", "e2b-key", "bench").stdout.strip().splitlines()[-1]
            opts = {"api_key": key, "api_url": server.base_url, "sandbox_url": server.base_url}
            e2b_boxes[name] = InterpreterSandbox.create(template="base", **opts)
            if name == "after":
                client = SandboxClient(identity_token=token, server_url=server.base_url)
                clients.append(client)
                native = client.sandbox(f"bench-native-{uuid.uuid4().hex[:6]}")
        for op in E2B_OPS:  # warm both paths (and write the file the reads read)
            for _ in range(2):
                for box in e2b_boxes.values():
                    E2B_OPS[op](box)
                NATIVE_OPS[op](native)
        for round_ in range(args.rounds):
            order = ("before", "after") if round_ % 2 == 0 else ("after", "before")
            for op in E2B_OPS:
                for name in order:
                    started = time.perf_counter()
                    E2B_OPS[op](e2b_boxes[name])
                    samples.setdefault((op, name), []).append(
                        (time.perf_counter() - started) * 1000
                    )
                started = time.perf_counter()
                NATIVE_OPS[op](native)
                took = (time.perf_counter() - started) * 1000
                samples.setdefault((op, "native"), []).append(took)
    finally:
        for box in e2b_boxes.values():
            box.kill()
        for client in clients:
            client.close()
        for server in servers.values():
            server.close()
    print(f"{'operation':9} {'podbay':>9} {'before':>9} {'after':>9}", end="")
    print(f" {'before/x':>9} {'after/x':>8}")
    for op in E2B_OPS:
        p50 = {k: statistics.median(samples[(op, k)]) for k in ("native", "before", "after")}
        print(
            f"{op:9} {p50['native']:9.2f} {p50['before']:9.2f} {p50['after']:9.2f} "
            f"{p50['before'] / p50['native']:9.2f} {p50['after'] / p50['native']:8.2f}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
