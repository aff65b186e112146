"""``run_code("1+1")`` through E2B's code interpreter SDK beside podbay's own, medians.

    .venv/bin/python bench/e2b_interpreter.py [--rounds N] [--json]

Starts a real ``podbay serve`` (default class), one deployment with an E2B
key, and one sandbox per SDK, each with a warm interpreter; the two calls
alternate so both see the same load. The E2B path is one streamed request
to the interpreter API, which relays it to the same kernel through the
sandbox's data plane; podbay's SDK reaches the kernel through the gateway
directly. The target of issue 26: the E2B path within 1.5x of the native.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from e2b_code_interpreter import Sandbox

from podbay import SandboxClient
from podbay.testing.platform import PlatformServer


def timed(action: Callable[[], object]) -> float:
    started = time.perf_counter()
    action()
    return (time.perf_counter() - started) * 1000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with PlatformServer.start(Path(tempfile.mkdtemp(prefix="podbay-bench-e2b-"))) as server:
        token = server.create_deployment("bench")
        key = server.cli("deployment", "e2b-key", "bench").stdout.strip().splitlines()[-1]
        e2b = Sandbox.create(
            template="base", api_key=key, api_url=server.base_url, sandbox_url=server.base_url
        )
        with SandboxClient(identity_token=token, server_url=server.base_url) as client:
            native = client.sandbox(f"bench-native-{uuid.uuid4().hex[:6]}")
            try:
                assert native.run_code("1+1").text == "2"
                assert e2b.run_code("1+1").text == "2"
                for _ in range(20):  # warm both paths' connections
                    native.run_code("1+1")
                    e2b.run_code("1+1")
                samples: dict[str, list[float]] = {"native": [], "e2b": []}
                for _ in range(args.rounds):
                    samples["native"].append(timed(lambda: native.run_code("1+1")))
                    samples["e2b"].append(timed(lambda: e2b.run_code("1+1")))
            finally:
                e2b.kill()
                client.delete(native.name)
    rows = {f"{label}_p50_ms": round(statistics.median(v), 2) for label, v in samples.items()}
    rows["ratio"] = round(rows["e2b_p50_ms"] / rows["native_p50_ms"], 2)
    if args.json:
        print(json.dumps(rows))
    else:
        print(
            f"run_code('1+1') p50: native {rows['native_p50_ms']} ms, "
            f"e2b-code-interpreter {rows['e2b_p50_ms']} ms ({rows['ratio']}x; "
            f"{args.rounds} rounds each)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
