"""Declared environments: is a sandbox with installed packages as quick as a plain one?

    .venv/bin/python bench/environment.py [--rounds N] [--warm-pool N] [--json]

Against a real ``podbay serve`` with real sandboxes. One deployment declares
nothing to install; another declares a Debian package, a PyPI package, an env
variable and one setup command. After the declared layer is built once (its
build time is reported), new sandboxes of both are attached alternately, each
deleted before the next, and the ratio of medians is printed.

Target: the declared sandbox is ready in under 2x the plain one (its layer is
built once and reused, so declaring packages must not slow every new sandbox).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from podbay.testing.platform import PlatformServer

PLAIN = "name: plain\nsandbox:\n  toolchain: never\n"
DECLARED = """\
name: declared
sandbox:
  toolchain: never
  packages: [tree]
  python:
    packages: [six==1.16.0]
  env:
    GREETING: hello
  setup:
    - echo "$GREETING" > /workspace/greeting
"""


def attach(server: PlatformServer, token: str, name: str) -> float:
    """Seconds from the first PUT to a 200 (following 202s)."""
    started = time.perf_counter()
    while True:
        response = server.attach(token, name)
        if response.status_code == 200:
            return time.perf_counter() - started
        if response.status_code != 202:
            raise RuntimeError(f"attach {name}: {response.status_code} {response.text}")
        time.sleep(0.2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument(
        "--warm-pool",
        type=int,
        default=0,
        help="ready machines per environment (0: every attach boots one)",
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    with (
        tempfile.TemporaryDirectory(prefix="podbay-bench-env-") as tmp,
        PlatformServer.start(
            Path(tmp), env={"PODBAY_RUNTIME_WARM_POOL": str(args.warm_pool)}
        ) as server,
    ):
        plain = server.create_deployment("plain", PLAIN)
        declared = server.create_deployment("declared", DECLARED)

        build = attach(server, declared, "build")  # the one slow attach: builds the layer
        server.api("DELETE", "/api/v1/sandboxes/build", declared)

        times: dict[str, list[float]] = {"plain": [], "declared": []}
        for i in range(args.rounds):
            for kind, token in (("plain", plain), ("declared", declared)):
                name = f"{kind}-{i}"
                if args.warm_pool:
                    time.sleep(0.3)  # let the pool refill, as a conversation's pace would
                times[kind].append(attach(server, token, name))
                assert server.api("DELETE", f"/api/v1/sandboxes/{name}", token).status_code == 204

    p50 = {k: statistics.median(v) * 1000 for k, v in times.items()}
    result = {
        "first_build_s": round(build, 2),
        "rounds": args.rounds,
        "warm_pool": args.warm_pool,
        "plain_p50_ms": round(p50["plain"], 1),
        "declared_p50_ms": round(p50["declared"], 1),
        "ratio": round(p50["declared"] / p50["plain"], 2),
    }
    if args.json:
        print(json.dumps(result))
        return
    print(f"first attach of the declaration (builds the layer): {result['first_build_s']} s")
    print(f"{'new sandbox, ready to exec':<34}{'p50 ms':>10}")
    print(f"{'  no packages':<34}{result['plain_p50_ms']:>10}")
    print(f"{'  declared (layer cached) + setup':<34}{result['declared_p50_ms']:>10}")
    print(
        f"ratio declared / plain: {result['ratio']}x  (target < 2x; "
        f"{args.rounds} rounds, warm pool {args.warm_pool})"
    )


if __name__ == "__main__":
    main()
