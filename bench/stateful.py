"""Checkpoint to disk and restore, per class, with a working set in memory.

Run as root with the base image cached::

    .venv/bin/python bench/stateful.py [--class gvisor] [--sizes 0,100] [--runs 3]

For each working set (MiB; 0 = an idle sandbox with only a counter) and each
run: a new machine with a counter process and, beside it, the working set as
random bytes a ``python3`` process holds (random, so no zero-page shortcut).
Then suspend with checkpointing on (timed: *checkpoint*), the image's size
on disk and the host memory the machine's cgroup held before and holds
after, then resume plus the first command's answer (``cat /tmp/n``; timed:
*restore → first output*). Prints every run and the medians. Other classes
add themselves to :data:`CLASSES`.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from podbay.runtime import classes
from podbay.runtime.agent_client import AgentClient
from podbay.runtime.base import Limits, MachineSpec
from podbay.runtime.oci import checkpoint, gc
from podbay.runtime.oci.driver import OciDriver
from podbay.settings import GIB, Settings

#: The classes this bench knows how to measure.
CLASSES = ("gvisor",)

MIB = 1024**2

COUNTER = "i=0; while :; do i=$((i+1)); echo $i > /tmp/n; sleep 0.2; done"


def spec(working_set_mib: int) -> MachineSpec:
    return MachineSpec(
        machine_id=f"st-{uuid.uuid4().hex[:8]}",
        hostname="bench",
        limits=Limits(
            memory_bytes=(512 + 2 * working_set_mib) * MIB,
            cpus=1.0,
            pids=256,
            disk_bytes=4 * GIB,
        ),
    )


async def cgroup_bytes(driver: OciDriver, machine_id: str) -> int:
    usage = await driver.usage(machine_id)
    return 0 if usage is None else usage.memory_bytes  # None: its cgroup is gone


async def one_run(driver: OciDriver, working_set_mib: int) -> dict[str, float]:
    made = spec(working_set_mib)
    machine_id = made.machine_id
    await driver.create(made)
    await driver.start(machine_id)
    agent = AgentClient(driver.agent_socket(machine_id))
    try:
        script = (
            f"nohup sh -c '{COUNTER}' >/dev/null 2>&1 </dev/null & "
            # Random bytes held by a process (python's, so not a file on disk).
            f"nohup python3 -c 'import os, time; b = os.urandom({working_set_mib} << 20); "
            'open("/tmp/ws", "w").close(); time.sleep(1e9)\' >/dev/null 2>&1 </dev/null & '
            "while [ ! -e /tmp/ws ]; do sleep 0.05; done; "
            "while [ ! -s /tmp/n ]; do sleep 0.05; done; cat /tmp/n"
        )
        done = await asyncio.to_thread(agent.sh, script)
        assert done.ok, done
        resident_before = await cgroup_bytes(driver, machine_id)
        t0 = time.perf_counter()
        await driver.suspend(machine_id)
        checkpointed = time.perf_counter() - t0
        image = checkpoint.image_dir(driver._paths(machine_id).home)
        image_bytes = sum(f.stat().st_size for f in image.iterdir())
        resident_after = await cgroup_bytes(driver, machine_id)
        t0 = time.perf_counter()
        await driver.resume(machine_id)
        answer = await asyncio.to_thread(agent.sh, "cat /tmp/n")
        restored = time.perf_counter() - t0
        assert answer.ok, answer
        assert int(answer.stdout) > 0, answer
        return {
            "checkpoint_s": checkpointed,
            "restore_first_output_s": restored,
            "image_mib": image_bytes / MIB,
            "resident_before_mib": resident_before / MIB,
            "resident_after_mib": resident_after / MIB,
        }
    finally:
        await driver.destroy(machine_id)


async def bench(args: argparse.Namespace) -> None:
    data = Path(tempfile.mkdtemp(prefix="podbay-stateful-"))
    settings = Settings.load(data_dir=data)
    settings.runtime.image_dir = args.image_dir
    settings.runtime.run_dir = f"/run/podbay-bench/{uuid.uuid4().hex[:8]}"
    settings.runtime.checkpoint_classes = args.sandbox_class
    driver = classes.build_driver(settings, args.sandbox_class)
    assert isinstance(driver, OciDriver)
    assert driver.checkpoints
    await driver.prepare()
    try:
        for size in (int(s) for s in args.sizes.split(",")):
            runs: list[dict[str, Any]] = []
            for n in range(args.runs):
                run = await one_run(driver, size)
                runs.append(run)
                print(f"{args.sandbox_class} {size} MiB run {n + 1}: " + _fmt(run), flush=True)
            medians = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
            print(f"{args.sandbox_class} {size} MiB median of {args.runs}: " + _fmt(medians))
    finally:
        await gc.collect(driver, everything=True)
        await driver.close()


def _fmt(run: dict[str, float]) -> str:
    return "  ".join(f"{k} {v:.3f}" for k, v in run.items())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--class", dest="sandbox_class", choices=CLASSES, default="gvisor")
    parser.add_argument("--sizes", default="0,100", help="working sets in MiB, comma-separated")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--image-dir", default="/var/tmp/podbay-test-images")
    asyncio.run(bench(parser.parse_args()))


if __name__ == "__main__":
    main()
