"""Checkpoint figures for the ``vm`` class (issue 27): suspend to disk and back.

Run as root with the base image cached (the tests' shared cache is used)::

    .venv/bin/python bench/stateful_vm.py [--runs 3] [--json]

One guest (TCG, 512 MiB, cold-booted), first idle, then with a 100 MiB working
set (random bytes a process holds, so no page is zero and skipped). Per run:

- checkpoint: ``driver.suspend`` with ``runtime.checkpoint_classes=vm``, from
  the call until QEMU is gone and the checkpoint sealed (fsynced);
- restore → first command output: from ``driver.resume`` until ``echo`` run
  through the agent socket has answered (a new connection, as the gateway's);
- the state file's size, and QEMU's resident memory before the checkpoint
  (after it there is no QEMU).

Medians over ``--runs``; a throwaway data directory, the guest destroyed at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shlex
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from podbay.runtime.agent_client import AgentClient
from podbay.runtime.vm.checkpoint import Checkpoint
from podbay.runtime.vm.driver import VmDriver
from podbay.testing.fixtures import end_vm_driver, forget_run_dir, sandbox_settings, small_spec

MIB = 1 << 20
# Filled a MiB at a time: a bytearray of os.urandom(100 MiB) would dirty 200 MiB
# (the bytes object freed stays in the guest's RAM, and so in the state).
WORKING_SET = (
    "import os, time; b = bytearray(100 << 20)\n"
    "for i in range(0, len(b), 1 << 20): b[i:i + (1 << 20)] = os.urandom(1 << 20)\n"
    "open('/tmp/ws-ready', 'w').close(); time.sleep(1e9)"
)


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


async def rounds(driver: VmDriver, machine_id: str, runs: int) -> dict[str, Any]:
    agent = AgentClient(driver.agent_socket(machine_id))
    saved = Checkpoint(driver.machines / machine_id)
    checkpoint_s, restore_s, state_mib, rss = [], [], [], []
    for _ in range(runs):
        pid = driver.qemu_pid(machine_id)
        assert pid is not None
        rss.append(rss_mib(pid))
        started = time.perf_counter()
        await driver.suspend(machine_id)
        checkpoint_s.append(time.perf_counter() - started)
        assert driver.qemu_pid(machine_id) is None
        state_mib.append(saved.state.stat().st_size / MIB)
        started = time.perf_counter()
        await driver.resume(machine_id)
        out = await asyncio.to_thread(agent.sh, "echo ok")
        restore_s.append(time.perf_counter() - started)
        assert out.stdout == "ok\n", out
    return {
        "checkpoint_s": statistics.median(checkpoint_s),
        "restore_to_first_output_s": statistics.median(restore_s),
        "state_mib": statistics.median(state_mib),
        "qemu_rss_before_mib": statistics.median(rss),
        "runs": {"checkpoint_s": checkpoint_s, "restore_to_first_output_s": restore_s},
    }


async def bench(runs: int) -> dict[str, Any]:
    data = Path(tempfile.mkdtemp(prefix="podbay-bench-ckpt-"))
    settings = sandbox_settings(data, memory_bytes=512 * MIB, checkpoint_classes="vm")
    driver = VmDriver(settings)
    driver.templates_enabled = False
    try:
        await driver.prepare()
        spec = small_spec(disk_bytes=1 << 30)
        await driver.create(spec)
        await driver.start(spec.machine_id)
        agent = AgentClient(driver.agent_socket(spec.machine_id))
        result = {"idle": await rounds(driver, spec.machine_id, runs)}
        await asyncio.to_thread(
            agent.exec, ["sh", "-c", f"printf %b {shlex.quote(WORKING_SET)} > /tmp/ws.py"]
        )
        started = await asyncio.to_thread(
            agent.sh,
            "setsid python3 /tmp/ws.py > /dev/null 2>&1 < /dev/null &"
            " while ! test -e /tmp/ws-ready; do sleep 0.05; done",
        )
        assert started.exit_code == 0, started
        result["working_set_100mib"] = await rounds(driver, spec.machine_id, runs)
        return result
    finally:
        await end_vm_driver(driver)
        forget_run_dir(settings)
        shutil.rmtree(data, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = asyncio.run(bench(args.runs))
    if args.json:
        print(json.dumps(result, indent=1))
        return
    for name, figures in result.items():
        print(
            f"{name}: checkpoint {figures['checkpoint_s']:.2f} s, restore → first output"
            f" {figures['restore_to_first_output_s']:.2f} s, state {figures['state_mib']:.0f} MiB,"
            f" QEMU RSS before {figures['qemu_rss_before_mib']:.0f} MiB (medians of {args.runs})"
        )


if __name__ == "__main__":
    main()
