"""Runtime figures: create-to-ready, suspend/resume, density and agent memory.

Run as root with the base image cached (the first run builds it)::

    .venv/bin/python bench/runtime.py [--class container|gvisor|vm] [--runs 20]
                                      [--density-max 100] [--json]

- create-to-ready: ``create`` + ``start`` until ``GET /v1/info`` answers, p50/p99;
  with the CPU each start cost (medians), which load inflates far less than
  time: this process's (the driver's), its reaped children's (the OCI runtime,
  the namespace holder), and the sandbox cgroup's (runc's init and the agent;
  ``container`` only);
- exec ``true`` through the agent socket, p50/p99: a new connection each (as
  :class:`AgentClient` calls), and on one kept connection (as the gateway's pool);
- suspend and resume latency, p50/p99;
- density: idle sandboxes started one after another until ``--density-max``,
  a failure, or host memory available drops under ``--reserve-mib``; with the
  agent's resident memory (RSS and PSS) per idle sandbox (for ``vm``: QEMU's,
  which holds the guest's memory), and the PSS and threads of all the host
  processes of each (under gVisor: sentry, gofer, stubs; the network helper).

Each class's driver is built as ``podbay serve`` builds it
(:func:`podbay.runtime.classes.build_driver`: ``gvisor`` is the OCI driver with
runsc in its own directories). ``--class vm`` boots QEMU microVMs under TCG;
try ``--runs 5 --density-max 10``.

Uses a throwaway data directory; every sandbox is destroyed at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import resource
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from podbay.errors import AgentError, AgentUnreachable
from podbay.runtime import agent_client, classes
from podbay.runtime.agent_client import AgentClient
from podbay.runtime.base import Driver, Limits, MachineSpec
from podbay.runtime.oci import gc
from podbay.runtime.oci.driver import OciDriver
from podbay.runtime.vm.driver import VmDriver
from podbay.settings import GIB, Settings
from podbay.wire import codec
from podbay.wire.data import ExecRequest
from podbay.wire.paths import EXEC

MIB = 1024 * 1024
CGROUP = Path("/sys/fs/cgroup")


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def spec(prefix: str, memory_bytes: int = 1 * GIB) -> MachineSpec:
    return MachineSpec(
        machine_id=f"{prefix}-{uuid.uuid4().hex[:10]}",
        hostname="bench",
        limits=Limits(memory_bytes=memory_bytes, cpus=1.0, pids=256, disk_bytes=10 * GIB),
    )


def make_driver(name: str, settings: Settings) -> Driver:
    return classes.build_driver(settings, name)


def machine_pid(driver: Driver, machine_id: str) -> int | None:
    """The process that holds the sandbox's memory: the agent, or QEMU."""
    if isinstance(driver, VmDriver):
        return driver.qemu_pid(machine_id)
    if isinstance(driver, OciDriver):
        state = driver.runc.state(machine_id)
        return None if state is None else state.pid
    return None


async def destroy_all(driver: Driver) -> None:
    if isinstance(driver, OciDriver):
        await gc.collect(driver, everything=True)
    elif isinstance(driver, VmDriver):
        for machine_id in driver.machine_ids():
            await driver.destroy(machine_id)


def available_mib() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) // 1024
    return 0


def children_cpu() -> float:
    """CPU seconds of every child this process has reaped."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def sandbox_cpu(driver: Driver, machine_id: str) -> float | None:
    """CPU seconds the sandbox's cgroup has used (``container``: runc's init and
    the agent), on cgroup v1 (cpuacct) or v2; ``None`` where there is none."""
    if not isinstance(driver, OciDriver) or not driver.runc.is_runc:
        return None
    cgroup = driver.layout.machine(machine_id).cgroup.strip("/")
    try:
        return int((CGROUP / "cpuacct" / cgroup / "cpuacct.usage").read_text()) / 1e9
    except OSError:
        pass
    try:
        for line in (CGROUP / cgroup / "cpu.stat").read_text().splitlines():
            if line.startswith("usage_usec "):
                return int(line.split()[1]) / 1e6
    except OSError:
        pass
    return None


def host_processes(machine_id: str, main_pid: int | None) -> set[int]:
    """Every host process of one sandbox: those in a cgroup named after it (the
    sandbox's own, its network helper's; under gVisor the sentry, the gofer and
    the ptrace stubs), and the process that holds its memory."""
    found = {main_pid} if main_pid else set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if machine_id in (entry / "cgroup").read_text():
                found.add(int(entry.name))
        except OSError:
            pass
    return found


def threads_of(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("Threads:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def memory_of(pid: int) -> tuple[float, float]:
    """(RSS, PSS) in MiB of one process."""
    rss = pss = 0
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Rss:"):
                rss = int(line.split()[1])
            elif line.startswith("Pss:"):
                pss = int(line.split()[1])
    except OSError:
        pass
    return rss / 1024, pss / 1024


async def bench(args: argparse.Namespace) -> dict[str, Any]:
    data = Path(tempfile.mkdtemp(prefix="podbay-bench-"))
    settings = Settings.load(data_dir=data)
    if args.image_dir:
        settings.runtime.image_dir = args.image_dir
    settings.runtime.run_dir = f"/run/podbay-bench/{uuid.uuid4().hex[:8]}"
    driver = make_driver(args.sandbox_class, settings)
    memory = args.memory_mib * MIB
    await driver.prepare()
    out: dict[str, Any] = {}
    try:
        # warm-up (page cache, first cgroup parents)
        warm = spec("warm", memory)
        await driver.create(warm)
        await driver.start(warm.machine_id)
        await driver.destroy(warm.machine_id)
        if isinstance(driver, VmDriver):
            await driver.wait_templates()  # built ahead, as the warm pool's boots are

        ready, creates = [], []
        cpu: dict[str, list[float]] = {"driver": [], "children": [], "sandbox": []}
        ids = []
        for _ in range(args.runs):
            s = spec("ready", memory)
            c0, r0 = time.process_time(), children_cpu()
            t0 = time.perf_counter()
            await driver.create(s)
            t1 = time.perf_counter()
            await driver.start(s.machine_id)
            t2 = time.perf_counter()
            cpu["driver"].append(time.process_time() - c0)
            cpu["children"].append(children_cpu() - r0)
            if (used := sandbox_cpu(driver, s.machine_id)) is not None:
                cpu["sandbox"].append(used)
            creates.append(t1 - t0)
            ready.append(t2 - t0)
            ids.append(s.machine_id)
            await asyncio.sleep(0.2)  # let the last agent settle, as between real attaches
        out["create_to_ready_ms"] = {
            "p50": pct(ready, 0.5) * 1000,
            "p99": pct(ready, 0.99) * 1000,
            "runs": len(ready),
        }
        out["create_ms_p50"] = pct(creates, 0.5) * 1000
        out["start_cpu_ms_p50"] = {k: pct(v, 0.5) * 1000 for k, v in cpu.items() if v}

        agent = AgentClient(driver.agent_socket(ids[0]))
        execs = []
        for _ in range(max(args.runs, 20)):
            t0 = time.perf_counter()
            await asyncio.to_thread(agent.exec, ["true"])
            execs.append(time.perf_counter() - t0)
        out["exec_true_ms"] = {"p50": pct(execs, 0.5) * 1000, "p99": pct(execs, 0.99) * 1000}
        # The gateway keeps its connections to an agent (dataplane/agentpool.py);
        # AgentClient opens one per call (under gVisor its host socket is
        # served by the sandbox's kernel, each connection a few system calls more).
        kept = []
        body = codec.dumps(ExecRequest(command=["true"]))
        headers = {"content-type": "application/json"}
        # The same client as AgentClient's, its connection kept between calls.
        connection = agent_client._UnixConnection(driver.agent_socket(ids[0]), 60)
        try:
            for _ in range(max(args.runs, 20)):
                t0 = time.perf_counter()
                connection.request("POST", EXEC, body, headers)
                answer = await asyncio.to_thread(connection.getresponse)
                answer.read()
                kept.append(time.perf_counter() - t0)
                assert answer.status == 200, answer.status
        finally:
            connection.close()
        out["exec_true_kept_ms"] = {"p50": pct(kept, 0.5) * 1000, "p99": pct(kept, 0.99) * 1000}

        suspends, resumes = [], []
        for _ in range(args.runs):
            for machine_id in ids[:1]:
                t0 = time.perf_counter()
                await driver.suspend(machine_id)
                t1 = time.perf_counter()
                await driver.resume(machine_id)
                t2 = time.perf_counter()
                suspends.append(t1 - t0)
                resumes.append(t2 - t1)
        out["suspend_ms"] = {"p50": pct(suspends, 0.5) * 1000, "p99": pct(suspends, 0.99) * 1000}
        out["resume_ms"] = {"p50": pct(resumes, 0.5) * 1000, "p99": pct(resumes, 0.99) * 1000}
        stops = []
        for machine_id in ids:
            t0 = time.perf_counter()
            await driver.destroy(machine_id)
            stops.append(time.perf_counter() - t0)
        out["destroy_ms_p50"] = pct(stops, 0.5) * 1000

        # density
        started: list[str] = []
        stop_reason = f"reached --density-max {args.density_max}"
        mem_start = available_mib()
        t_start = time.perf_counter()
        while len(started) < args.density_max:
            if available_mib() < args.reserve_mib:
                stop_reason = f"host memory available fell under {args.reserve_mib} MiB"
                break
            s = spec("dense", memory)
            try:
                await driver.create(s)
                await driver.start(s.machine_id)
            except Exception as e:  # noqa: BLE001 - recorded as why the density run stopped
                stop_reason = f"start failed: {e}"
                break
            started.append(s.machine_id)
        took = time.perf_counter() - t_start
        await asyncio.sleep(2)  # idle
        rss, pss, whole_pss, threads = [], [], [], []
        for machine_id in started:
            pid = machine_pid(driver, machine_id)
            if pid is not None:
                r, p = memory_of(pid)
                rss.append(r)
                pss.append(p)
            every = host_processes(machine_id, pid)
            whole_pss.append(sum(memory_of(each)[1] for each in every))
            threads.append(sum(threads_of(each) for each in every))
        mem_end = available_mib()
        out["density"] = {
            "sandboxes": len(started),
            "stopped_because": stop_reason,
            "seconds_to_start_all": took,
            "host_memory_used_mib": mem_start - mem_end,
            "host_memory_per_sandbox_mib": (mem_start - mem_end) / max(1, len(started)),
            "agent_rss_mib": {
                "median": statistics.median(rss) if rss else None,
                "max": max(rss) if rss else None,
            },
            "agent_pss_mib_median": statistics.median(pss) if pss else None,
            # PSS shares pages fairly between sandboxes, so this sums to the host's use.
            "host_pss_mib_per_sandbox_median": statistics.median(whole_pss) if whole_pss else None,
            "host_threads_per_sandbox_median": statistics.median(threads) if threads else None,
        }
        alive = 0
        for machine_id in started:
            try:
                await asyncio.to_thread(AgentClient(driver.agent_socket(machine_id)).info)
                alive += 1
            except (AgentError, AgentUnreachable):  # counted as not answering
                pass
        out["density"]["answering"] = alive
    finally:
        await destroy_all(driver)
        await driver.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--class", dest="sandbox_class", choices=tuple(classes.CLASSES), default="container"
    )
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--memory-mib", type=int, default=1024)
    parser.add_argument("--density-max", type=int, default=100)
    parser.add_argument("--reserve-mib", type=int, default=4096)
    parser.add_argument("--image-dir", default="/var/tmp/podbay-test-images")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    result = asyncio.run(bench(args))
    if args.json:
        print(json.dumps(result, indent=2))
        return
    r, s, u, d = (
        result["create_to_ready_ms"],
        result["suspend_ms"],
        result["resume_ms"],
        result["density"],
    )
    e = result["exec_true_ms"]
    print(
        f"create-to-ready  p50 {r['p50']:.0f} ms  p99 {r['p99']:.0f} ms  ({r['runs']} runs; "
        f"create alone p50 {result['create_ms_p50']:.0f} ms)"
    )
    cpu = ", ".join(f"{k} {v:.1f}" for k, v in result["start_cpu_ms_p50"].items())
    print(f"CPU per start    p50 {cpu} ms")
    k = result["exec_true_kept_ms"]
    print(f"exec true        p50 {e['p50']:.2f} ms  p99 {e['p99']:.2f} ms  (a connection each)")
    print(f"exec true        p50 {k['p50']:.2f} ms  p99 {k['p99']:.2f} ms  (one kept connection)")
    print(f"suspend          p50 {s['p50']:.2f} ms  p99 {s['p99']:.2f} ms")
    print(f"resume           p50 {u['p50']:.2f} ms  p99 {u['p99']:.2f} ms")
    print(f"destroy          p50 {result['destroy_ms_p50']:.0f} ms")
    print(
        f"density          {d['sandboxes']} idle sandboxes ({d['stopped_because']}), "
        f"{d['answering']} answering; started in {d['seconds_to_start_all']:.1f} s"
    )
    rss = d["agent_rss_mib"]
    if rss["median"] is None:  # no single process holds it (gVisor: sentry and gofer)
        print(f"host memory      {d['host_memory_per_sandbox_mib']:.1f} MiB per idle sandbox")
    else:
        print(
            f"agent memory     RSS median {rss['median']:.1f} MiB (max {rss['max']:.1f}), "
            f"PSS median {d['agent_pss_mib_median']:.1f} MiB; host memory per sandbox "
            f"{d['host_memory_per_sandbox_mib']:.1f} MiB"
        )
    if d["host_pss_mib_per_sandbox_median"] is not None:
        print(
            f"host processes   PSS median {d['host_pss_mib_per_sandbox_median']:.1f} MiB, "
            f"threads median {d['host_threads_per_sandbox_median']:.0f} per idle sandbox "
            "(every host process of it: agent or sentry, gofer, stubs, network helper)"
        )


if __name__ == "__main__":
    main()
