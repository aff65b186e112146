"""The container driver of two or more checkouts, interleaved op by op: create-to-ready,
exec ``true``, suspend/resume, and exec straight to an agent's socket.

Run as root with the base image cached (bench/runtime.py builds it)::

    git archive OLD src | tar -x -C /tmp/old
    .venv/bin/python bench/driver_ab.py new=src old=/tmp/old/src \\
        [--rounds 30] [--ops create:1,exec:10,flip:5,agent:30]

``PODBAY_RUNTIME_OCI_RUNTIME=runsc`` in the environment measures the gVisor
driver instead (the settings are read from it).

Each ``NAME=SRC`` runs in a child process of this script with ``PYTHONPATH=SRC``
and its own throwaway data directory (removed at the end unless something is
left mounted in it), building that checkout's OCI driver (runc) as the oldest
one measured (stop 7, 7bf4e6d) did. Every round runs each op
in every child in turn (the order rotating by round), so that a machine shared
with other work slows them alike; figures are medians over all rounds, CPU
figures means (load inflates them far less than times). The ops, ``OP:N``:

* ``create``: N sandboxes created and started until the agent answers
  (``ready``), with the CPU each start cost the driver's process, its reaped
  children (runc, the namespace holder) and the sandbox's cgroup; destroyed
  after the op;
* ``exec``: N exec ``true`` with the checkout's own ``AgentClient`` (a
  connection per call, from a thread, as bench/runtime.py does) on one sandbox
  kept for the run, with the client process's and the sandbox's CPU per exec;
* ``flip``: N suspend + resume pairs of that sandbox, back to back, with the
  driver process's CPU per pair;
* ``agent``: N exec ``/bin/true`` over one kept-alive connection to an agent
  staged from the checkout and run on the host (as bench/agent_exec.py does),
  with the agent's CPU per exec.
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import json
import os
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

CGROUP = Path("/sys/fs/cgroup")
AGENT_PYTHON = "/usr/bin/python3.11"  # the image's interpreter, as agent_exec.py


# -- the child: one checkout -------------------------------------------------------------
def cpu_of(pid: int) -> float:
    """CPU seconds of a process and its reaped children."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(value) for value in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def reaped_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def sandbox_cpu(driver: Any, machine_id: str) -> float:
    """CPU seconds of the sandbox's cgroup (v1 cpuacct or v2); NaN where unknown."""
    try:
        cgroup = driver.layout.machine(machine_id).cgroup.strip("/")
    except AttributeError:  # a checkout without the layout's cgroup path
        return float("nan")
    try:
        return int((CGROUP / "cpuacct" / cgroup / "cpuacct.usage").read_text()) / 1e9
    except OSError:
        pass
    try:
        stat = (CGROUP / cgroup / "cpu.stat").read_text().split()
        return int(stat[stat.index("usage_usec") + 1]) / 1e6
    except (OSError, ValueError):
        return float("nan")


def exchange(sock: socket.socket, request: bytes) -> bytes:
    """One keep-alive HTTP/1.1 exchange on ``sock``: the answer's status line and
    body (the agent always sends a content-length)."""
    sock.sendall(request)
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
    while len(body) < length:
        body += sock.recv(65536)
    return head.split(b"\r\n")[0] + b" " + body


def host_agent(tmp: Path) -> tuple[subprocess.Popen[bytes], socket.socket]:
    """The checkout's agent staged and started as the runtime starts it."""
    from podbay.runtime import staging

    new_style = "python" in inspect.signature(staging.stage).parameters  # since 2a74deb
    staged = (
        staging.stage(tmp / "staged", python=[AGENT_PYTHON])
        if new_style
        else staging.stage(tmp / "staged")
    )
    python: Any = [AGENT_PYTHON] if new_style else AGENT_PYTHON
    (tmp / "workspace").mkdir()
    path = str(tmp / "agent.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(16)
    argv = staging.agent_argv(
        python, staged, "--fd", str(listener.fileno()), "--workspace", str(tmp / "workspace")
    )
    env = dict(getattr(staging, "AGENT_ENV", {}))
    agent = subprocess.Popen(argv, pass_fds=(listener.fileno(),), env=env)
    listener.close()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(path)
    return agent, sock


def remove_unless_mounted(data: Path) -> None:
    """Remove ``data`` when nothing is mounted below it (rmtree would go inside)."""
    mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    if not any(f" {data}/" in line for line in mounts):
        shutil.rmtree(data, ignore_errors=True)


async def child(ops: set[str]) -> None:
    from podbay.runtime.agent_client import AgentClient
    from podbay.runtime.base import Limits, MachineSpec
    from podbay.runtime.oci import gc
    from podbay.runtime.oci.driver import OciDriver
    from podbay.settings import GIB, Settings

    def spec() -> MachineSpec:
        return MachineSpec(
            machine_id=f"ab-{uuid.uuid4().hex[:10]}",
            hostname="bench",
            limits=Limits(memory_bytes=GIB, cpus=1.0, pids=256, disk_bytes=10 * GIB),
        )

    data = Path(tempfile.mkdtemp(prefix="podbay-ab-"))
    settings = Settings.load(data_dir=data)
    settings.runtime.image_dir = "/var/tmp/podbay-test-images"
    settings.runtime.run_dir = f"/run/podbay-bench/{uuid.uuid4().hex[:8]}"
    driver = OciDriver(settings)
    await driver.prepare()
    kept = spec()
    if ops - {"agent"}:  # a sandbox to keep, and the warm-up (page cache, cgroup parents)
        await driver.create(kept)
        await driver.start(kept.machine_id)
    client = AgentClient(driver.agent_socket(kept.machine_id))
    agent, sock = host_agent(data / "host-agent")
    body = json.dumps({"command": ["/bin/true"]}).encode()
    request = b"POST /v1/exec HTTP/1.1\r\nHost: agent\r\nContent-Length: %d\r\n\r\n%s" % (
        len(body),
        body,
    )
    for _ in range(20):
        if ops - {"agent"}:
            client.exec(["true"])
        exchange(sock, request)
    print("{}", flush=True)
    try:
        for line in sys.stdin:
            op, n = json.loads(line)
            out: dict[str, list[float]] = {}
            own, sandbox = time.process_time(), sandbox_cpu(driver, kept.machine_id)
            if op == "create":
                made = []
                for _ in range(n):
                    s, own, reaped = spec(), time.process_time(), reaped_cpu()
                    t0 = time.perf_counter()
                    await driver.create(s)
                    await driver.start(s.machine_id)
                    out.setdefault("ready ms", []).append((time.perf_counter() - t0) * 1000)
                    out.setdefault("start cpu: driver", []).append(time.process_time() - own)
                    out.setdefault("start cpu: children", []).append(reaped_cpu() - reaped)
                    cpu = sandbox_cpu(driver, s.machine_id)
                    out.setdefault("start cpu: sandbox", []).append(cpu)
                    made.append(s.machine_id)
                    await asyncio.sleep(0.2)  # the agent settles, as between real attaches
                for machine_id in made:
                    await driver.destroy(machine_id)
            elif op == "exec":
                for _ in range(n):
                    t0 = time.perf_counter()
                    await asyncio.to_thread(client.exec, ["true"])
                    out.setdefault("exec true ms", []).append((time.perf_counter() - t0) * 1000)
                out["exec cpu: client"] = [(time.process_time() - own) / n]
                used = sandbox_cpu(driver, kept.machine_id) - sandbox
                out["exec cpu: sandbox"] = [used / n]
            elif op == "flip":
                for _ in range(n):
                    t0 = time.perf_counter()
                    await driver.suspend(kept.machine_id)
                    t1 = time.perf_counter()
                    await driver.resume(kept.machine_id)
                    out.setdefault("suspend ms", []).append((t1 - t0) * 1000)
                    out.setdefault("resume ms", []).append((time.perf_counter() - t1) * 1000)
                out["flip cpu: driver"] = [(time.process_time() - own) / n]
            elif op == "agent":
                before = cpu_of(agent.pid)
                for _ in range(n):
                    t0 = time.perf_counter()
                    answer = exchange(sock, request)
                    out.setdefault("agent exec ms", []).append((time.perf_counter() - t0) * 1000)
                    assert b" 200 " in answer, answer
                    assert b'"exit_code":0' in answer, answer
                out["agent exec cpu: agent"] = [(cpu_of(agent.pid) - before) / n]
            print(json.dumps(out), flush=True)
    finally:
        agent.terminate()
        agent.wait(5)
        await gc.collect(driver, everything=True)
        await driver.close()
        remove_unless_mounted(data)


# -- the parent ----------------------------------------------------------------------------
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("checkouts", nargs="*", metavar="NAME=SRC")
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--ops", default="create:1,exec:10,flip:5,agent:30")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    ops = [(op, int(n)) for op, _, n in (item.partition(":") for item in args.ops.split(","))]
    if args.worker:
        asyncio.run(child({op for op, _ in ops}))
        return
    children: dict[str, subprocess.Popen[str]] = {}
    for item in args.checkouts:
        name, _, src = item.partition("=")
        env = dict(os.environ, PYTHONPATH=str(Path(src).resolve()))
        children[name] = subprocess.Popen(
            [sys.executable, __file__, "--worker", "--ops", args.ops],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
    for proc in children.values():
        assert proc.stdout is not None, "a child failed"
        assert proc.stdout.readline() == "{}\n", "a child failed"
    figures: dict[str, dict[str, list[float]]] = {name: {} for name in children}
    names, loads, started = list(children), [], time.perf_counter()
    try:
        for round_ in range(args.rounds):
            loads.append(os.getloadavg()[0])
            order = names[round_ % len(names) :] + names[: round_ % len(names)]
            for op in ops:
                for name in order:
                    proc = children[name]
                    assert proc.stdin is not None
                    assert proc.stdout is not None
                    proc.stdin.write(json.dumps(op) + "\n")
                    proc.stdin.flush()
                    for key, values in json.loads(proc.stdout.readline()).items():
                        figures[name].setdefault(key, []).extend(values)
    finally:
        for proc in children.values():
            assert proc.stdin is not None
            proc.stdin.close()
        for proc in children.values():
            proc.wait(120)
    print(
        f"{args.rounds} rounds of {args.ops}, load average (1 min) {min(loads):.1f}-"
        f"{max(loads):.1f}, {time.perf_counter() - started:.0f} s; times: medians, "
        "cpu: means, ms"
    )
    print(f"{'':24}" + "".join(f"{name:>12}" for name in names))
    for key in figures[names[0]]:
        row = []
        for name in names:
            values = figures[name].get(key, [])
            if "cpu" in key:
                cell = statistics.fmean(values) * 1000 if values else float("nan")
            else:
                cell = statistics.median(values) if values else float("nan")
            row.append(f"{cell:12.2f}")
        print(f"{key:24}" + "".join(row))


if __name__ == "__main__":
    main()
