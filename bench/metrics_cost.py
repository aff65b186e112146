"""Metrics sampling cost per sandbox on the node (docs/observability.md):
the CPU one :meth:`usage` reading of a running sandbox costs the node, which
samples each running sandbox every 2 s (target: at most 0.1 % of a core).

Run as root with the base image cached (the first run builds it)::

    .venv/bin/python bench/metrics_cost.py [--class gvisor|container|vm]
                                           [--sandboxes 3] [--rounds 200] [--json]

Starts ``--sandboxes`` idle machines with the class's driver (as ``podbay
serve`` builds it), then reads each one's usage ``--rounds`` times, as the
sampler does, and reports the process CPU time (user + system, which load on
a shared host inflates far less than wall time) per reading: median of the
rounds and p99, and that median as a share of one core at one reading per
2 s. ``vm`` readings include the guest agent's answer (a host thread and a
unix-socket call); the guest's own CPU for it is not counted here.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from podbay.runtime.usage import MeasuredDriver
from podbay.runtime.vm.driver import VmDriver
from podbay.settings import Settings
from podbay.wire.observe import METRICS_INTERVAL_SECONDS
from runtime import destroy_all, make_driver, pct, spec  # bench/runtime.py

MIB = 1024 * 1024


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    data = Path(tempfile.mkdtemp(prefix="podbay-bench-"))
    settings = Settings.load(data_dir=data)
    if args.image_dir:
        settings.runtime.image_dir = args.image_dir
    settings.runtime.run_dir = f"/run/podbay-bench/{uuid.uuid4().hex[:8]}"
    driver = make_driver(args.sandbox_class, settings)
    assert isinstance(driver, MeasuredDriver)
    await driver.prepare()
    try:
        machines = []
        for _ in range(args.sandboxes):
            machine = spec("metrics", args.memory_mib * MIB)
            await driver.create(machine)
            await driver.start(machine.machine_id)
            machines.append(machine.machine_id)
        per_reading: list[float] = []
        for _ in range(args.rounds):
            cpu = time.process_time()
            for machine_id in machines:
                assert await driver.usage(machine_id) is not None
            per_reading.append((time.process_time() - cpu) / len(machines))
        median = statistics.median(per_reading)
        return {
            "class": args.sandbox_class,
            "sandboxes": len(machines),
            "rounds": args.rounds,
            "cpu_ms_per_reading_p50": median * 1000,
            "cpu_ms_per_reading_p99": pct(per_reading, 0.99) * 1000,
            "core_share_percent_per_sandbox": median / METRICS_INTERVAL_SECONDS * 100,
        }
    finally:
        if isinstance(driver, VmDriver):  # a template it builds meanwhile would outlive it
            await driver.wait_templates()
        await destroy_all(driver)
        await driver.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--class", dest="sandbox_class", default="gvisor")
    parser.add_argument("--sandboxes", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--memory-mib", type=int, default=512)
    parser.add_argument("--image-dir", default="/var/tmp/podbay-test-images")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = asyncio.run(bench(args))
    if args.json:
        print(json.dumps(result))
        return
    print(
        f"{result['class']}: {result['sandboxes']} sandboxes x {result['rounds']} readings: "
        f"CPU per reading p50 {result['cpu_ms_per_reading_p50']:.3f} ms, "
        f"p99 {result['cpu_ms_per_reading_p99']:.3f} ms; at one reading per "
        f"{METRICS_INTERVAL_SECONDS:.0f} s: {result['core_share_percent_per_sandbox']:.4f} % "
        "of a core per sandbox (target <= 0.1 %)"
    )


if __name__ == "__main__":
    main()
