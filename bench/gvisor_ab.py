"""gVisor sandboxes with this checkout's agent (B) against another's (A), interleaved.

Run as root with the base image cached::

    git archive OLD src | tar -x -C /tmp/old
    .venv/bin/python bench/gvisor_ab.py --against /tmp/old/src [--execs 150] [--info]
                                        [--ready 15] [--a-flags '...'] [--b-flags '...']
                                        [--a-chain]

One ``gvisor`` driver of this checkout runs both columns; what differs is the
agent: its staged code (``--against SRC``: the ``podbay`` package under SRC)
and its start-up program (:func:`podbay.runtime.staging.launch_code` of either
tree), and the runsc flags each column adds (``--a-flags``, ``--b-flags``);
``--a-chain`` starts A's runsc as a host without ``runsc-enter`` would.
Samples alternate A B A B ... (starts A B, B A, ...), so that a machine shared
with other work slows both alike; ``B/A`` is the median of the pairwise ratios.
Beside each time, the CPU the sandbox's host processes (sentry, its ptrace stubs, gofer) spent on it
(a mean: /proc counts it in 10 ms ticks), which load inflates far less than time:

- ``--ready N``: create + start until the agent answers, N pairs, and of that
  the agent's own start (from ``runsc run``'s exit);
- ``--info``: ``GET /v1/info`` on a new connection (the agent's HTTP alone);
- exec ``true`` (``--cmd`` for another argv), ``--execs`` pairs.

With ``--runsc-debug DIR``, B's runsc writes its debug log and its sandbox's
system calls (``--strace``) under DIR (slow: for counting, not timing).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import os
import shlex
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from podbay.runtime import classes, staging
from podbay.runtime.agent_client import AgentClient
from podbay.runtime.base import Limits, MachineSpec
from podbay.runtime.oci import gc, runsc
from podbay.runtime.oci.driver import OciDriver
from podbay.settings import GIB, Settings

COLUMNS = ("A", "B")


def spec(prefix: str) -> MachineSpec:
    return MachineSpec(
        machine_id=f"{prefix}-{uuid.uuid4().hex[:8]}",
        hostname="bench",
        limits=Limits(memory_bytes=GIB, cpus=1.0, pids=256, disk_bytes=10 * GIB),
    )


def tree_cpu(roots: list[int]) -> float:
    """CPU seconds of ``roots`` and their live descendants (with what each reaped)."""
    children: dict[int, list[int]] = {}
    used: dict[int, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{name}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        used[int(name)] = sum(int(x) for x in fields[11:15]) / tick
        children.setdefault(int(fields[1]), []).append(int(name))
    total, todo = 0.0, list(roots)
    while todo:
        pid = todo.pop()
        total += used.get(pid, 0.0)
        todo += children.get(pid, [])
    return total


def host_pids(driver: OciDriver, machine_id: str) -> list[int]:
    """The sandbox's sentry and gofer (from runsc's state file)."""
    assert isinstance(driver.runc, runsc.Runsc)
    raw = json.loads(driver.runc._state_file(machine_id).read_text())
    return [int(raw["sandbox"]["pid"]), int(raw["goferPid"])]


def report(name: str, times: dict[str, list[float]], cpu: dict[str, list[float]]) -> None:
    for column in COLUMNS:
        t, c = times[column], cpu[column]
        print(
            f"{name} {column}: p50 {statistics.median(t) * 1000:.2f} ms  "
            f"min {min(t) * 1000:.2f}  sandbox CPU mean {statistics.mean(c) * 1000:.1f} ms"
        )
    ratios = [b / a for a, b in zip(times["A"], times["B"], strict=True)]
    print(f"{name} B/A: {statistics.median(ratios):.3f} (median of pairs)")


async def bench(args: argparse.Namespace) -> None:
    data = Path(tempfile.mkdtemp(prefix="podbay-gvisor-ab-"))
    settings = Settings.load(data_dir=data)
    settings.runtime.image_dir = args.image_dir
    settings.runtime.run_dir = f"/run/podbay-bench/{uuid.uuid4().hex[:8]}"
    driver = classes.build_driver(settings, "gvisor")
    assert isinstance(driver, OciDriver)
    await driver.prepare()
    assert driver._image is not None
    assert driver._agent_dir is not None
    from podbay.runtime.agent_bundle import image_python

    agents = {"B": driver._agent_dir, "A": driver._agent_dir}
    argvs = {"B": driver._argv, "A": driver._argv}
    if args.against:
        package = Path(args.against) / "podbay"
        ours = staging.source_root
        staging.source_root = lambda: package  # type: ignore[assignment]
        try:
            staged = staging.stage(data / "agent-a", python=image_python(driver._image.rootfs))
        finally:
            staging.source_root = ours  # type: ignore[assignment]
        agents["A"] = runsc.reachable_agent(staged, driver.layout.run_dir)
        # The start-up program is built on the driver's side: take A's from its tree.
        # (runtime/staging.py; agent/staging.py in trees older than podbay.host)
        theirs_path = package / "runtime/staging.py"
        if not theirs_path.exists():
            theirs_path = package / "agent/staging.py"
        loaded = importlib.util.spec_from_file_location("a_staging", theirs_path)
        assert loaded is not None
        assert loaded.loader is not None
        theirs: Any = importlib.util.module_from_spec(loaded)
        loaded.loader.exec_module(theirs)
        kept = staging._USE_BUNDLE, staging.START_AGENT
        staging._USE_BUNDLE = theirs._USE_BUNDLE
        staging.START_AGENT = getattr(theirs, "START_AGENT", staging.START_AGENT)
        try:
            argvs["A"] = driver._agent_argv(driver._image)
        finally:
            staging._USE_BUNDLE, staging.START_AGENT = kept
        if "--launcher" not in (package / "agent/__main__.py").read_text():
            at = argvs["A"].index("--launcher") if "--launcher" in argvs["A"] else -1
            if at >= 0:  # an agent from before the launcher program
                del argvs["A"][at : at + 2]
    flags = {"A": shlex.split(args.a_flags), "B": shlex.split(args.b_flags)}
    if args.runsc_debug:
        os.makedirs(args.runsc_debug, exist_ok=True)
        flags["B"] += ["--debug", f"--debug-log={args.runsc_debug}/", "--strace"]
    plain_argv = runsc.Runsc.argv
    assert isinstance(driver.runc, runsc.Runsc)
    enters = {"A": None if args.a_chain else driver.runc.enter, "B": driver.runc.enter}

    def use(column: str) -> None:
        driver._agent_dir, driver._argv = agents[column], argvs[column]
        assert isinstance(driver.runc, runsc.Runsc)
        driver.runc.enter = enters[column]
        extra = flags[column]

        def argv(self: runsc.Runsc, *rest: str) -> list[str]:
            full = plain_argv(self, *rest)
            return [*full[: len(full) - len(rest)], *extra, *rest]

        runsc.Runsc.argv = argv  # type: ignore[method-assign]

    # When ``runsc run`` returned (the container's process started): the agent's own
    # start is from then to its first answer.
    ran: list[float] = []
    run_detached = driver.runc.run_detached

    async def stamped(*a: Any, **k: Any) -> None:
        await run_detached(*a, **k)
        ran.append(time.perf_counter())

    driver.runc.run_detached = stamped  # type: ignore[method-assign]
    try:
        if args.ready:
            times: dict[str, list[float]] = {c: [] for c in COLUMNS}
            cpu: dict[str, list[float]] = {c: [] for c in COLUMNS}
            agent: dict[str, list[float]] = {c: [] for c in COLUMNS}
            for n in range(args.ready):
                # A B, then B A: the second start of a pair ran slower (the first's
                # destroy still settling), which a fixed order charged to B.
                for column in COLUMNS if n % 2 == 0 else COLUMNS[::-1]:
                    use(column)
                    s = spec("ready-" + column.lower())
                    t0 = time.perf_counter()
                    await driver.create(s)
                    await driver.start(s.machine_id)
                    times[column].append(time.perf_counter() - t0)
                    agent[column].append(time.perf_counter() - ran[-1])
                    cpu[column].append(tree_cpu(host_pids(driver, s.machine_id)))
                    await driver.destroy(s.machine_id)
                    await asyncio.sleep(0.2)  # as between real attaches
            report("create-to-ready", times, cpu)
            report("agent (runsc run's exit to its first answer)", agent, cpu)
        ids, clients, pids = {}, {}, {}
        for column in COLUMNS:
            use(column)
            s = spec("exec-" + column.lower())
            await driver.create(s)
            await driver.start(s.machine_id)
            ids[column] = s.machine_id
            clients[column] = AgentClient(driver.agent_socket(s.machine_id))
            pids[column] = host_pids(driver, s.machine_id)
        command = shlex.split(args.cmd)
        for column in COLUMNS:  # past the sandbox's first second (its clock traps then)
            for _ in range(5):
                await asyncio.to_thread(clients[column].exec, command)
        calls = [("info", lambda c: c.info())] if args.info else []
        calls.append(("exec " + args.cmd, lambda c: c.exec(command)))
        for name, call in calls:
            times = {c: [] for c in COLUMNS}
            cpu = {c: [] for c in COLUMNS}
            for _ in range(args.execs):
                for column in COLUMNS:
                    c0 = tree_cpu(pids[column])
                    t0 = time.perf_counter()
                    await asyncio.to_thread(call, clients[column])
                    times[column].append(time.perf_counter() - t0)
                    cpu[column].append(tree_cpu(pids[column]) - c0)
            report(name, times, cpu)
    finally:
        runsc.Runsc.argv = plain_argv  # type: ignore[method-assign]
        await gc.collect(driver, everything=True)
        await driver.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--against", help="another checkout's src directory (column A)")
    parser.add_argument("--execs", type=int, default=100)
    parser.add_argument("--ready", type=int, default=0)
    parser.add_argument("--info", action="store_true")
    parser.add_argument("--cmd", default="true")
    parser.add_argument(
        "--a-chain",
        action="store_true",
        help="A starts runsc through nsenter, unshare and sh (as without runsc-enter)",
    )
    parser.add_argument("--a-flags", default="")
    parser.add_argument("--b-flags", default="")
    parser.add_argument("--runsc-debug")
    parser.add_argument("--image-dir", default="/var/tmp/podbay-test-images")
    asyncio.run(bench(parser.parse_args()))


if __name__ == "__main__":
    main()
