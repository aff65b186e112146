"""The Python function calls ``podbay serve`` makes per exec: a measure of the
server's work that a loaded machine does not change (CPU time does: on the
2-core machine shared with other test runs, serve's CPU per exec swung by more
than the regression being looked for).

A real ``podbay serve`` (container class, a data directory of its own, a
loopback port) runs with a profile hook in every thread that counts each call
of a Python function (and of a built-in) while a gate is open. The gate is
opened (SIGUSR1) and closed (SIGUSR2, which writes the counts) around
``--execs`` execs of ``true`` on one running sandbox, one after another on a
kept connection, after ``--warm`` execs that are not counted. It prints calls
per exec (Python and built-in), the functions with the most calls per exec, and
serve's CPU per exec meanwhile (for information: that one load changes).

Run against another checkout by putting its ``src`` first::

    PYTHONPATH=/path/to/other/src .venv/bin/python bench/serve_calls.py

The checkout imported is the one measured (server and ``podbay.testing``).
The counts are not exact to the call (event-loop turns depend on when the
agent's answer arrives) but repeat to within ~1 %.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from podbay.host.storage import remove_tree
from podbay.testing.platform import PlatformServer

#: Started in the server's interpreter before podbay: the counting hook, set in
#: this thread and every thread started later (the server's executor threads
#: run the agent client), and the gate's signals.
BOOTSTRAP = r"""
import collections, gc, json, os, signal, sys, threading
counts = collections.Counter()
gate = [False]
before = []
freed = [0]
def on_gc(phase, info):
    if gate[0] and phase == "stop":
        freed[0] += info["collected"]
gc.callbacks.append(on_gc)
def hook(frame, event, arg):
    if gate[0]:
        if event == "call":
            c = frame.f_code
            counts[(c.co_filename, c.co_firstlineno, c.co_name)] += 1
        elif event == "c_call":
            counts[("<builtin>", 0, getattr(arg, "__qualname__", repr(arg)))] += 1
def on(*_):
    counts.clear()
    freed[0] = 0
    if os.environ.get("PODBAY_CALLS_GARBAGE"):
        gc.collect()
        gc.set_debug(gc.DEBUG_SAVEALL)
    before[:] = [s["collections"] for s in gc.get_stats()]
    gate[0] = True
def off(*_):
    gate[0] = False
    rows = [[f, line, name, n] for (f, line, name), n in counts.items()]
    for gen, (s, was) in enumerate(zip(gc.get_stats(), before)):
        rows.append(["<gc>", gen, f"gen{gen} collections", s["collections"] - was])
    rows.append(["<gc>", 3, "objects in garbage cycles freed", freed[0]])
    if os.environ.get("PODBAY_CALLS_GARBAGE"):
        gc.collect()
        kinds = collections.Counter(type(o).__qualname__ for o in gc.garbage)
        rows.extend(["<garbage>", 0, kind, n] for kind, n in kinds.items())
        gc.garbage.clear()
        gc.set_debug(0)
    rows.append(["<gc>", 4, "objects tracked at the end", len(gc.get_objects())])
    with open(os.environ["PODBAY_CALLS_OUT"], "w") as out:
        json.dump(rows, out)
signal.signal(signal.SIGUSR1, on)
signal.signal(signal.SIGUSR2, off)
threading.setprofile(hook)
sys.setprofile(hook)
sys.argv = ["podbay", *sys.argv[1:]]
import runpy
runpy.run_module("podbay.cli.main", run_name="__main__")
"""


class CountedServer(PlatformServer):
    def spawn(self) -> None:
        log = open(self.log_path, "ab")  # noqa: SIM115 - owned by the child
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-c",
                BOOTSTRAP,
                self.role,
                "--data-dir",
                str(self.data_dir),
                "--listen",
                f"127.0.0.1:{self.port}",
            ],
            env=self.env,
            stdout=log,
            stderr=log,
            start_new_session=True,
        )
        log.close()


def threads_cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def execs(handles: list[dict[str, Any]], clients: int, total: int) -> None:
    """``total`` execs of ``true``, ``clients`` threads at once over ``handles`` in
    turn, each thread on a kept connection (as compare.py's throughput row)."""

    def worker(first: int) -> None:
        with httpx.Client(timeout=60) as http:
            for k in range(first, total, clients):
                h = handles[k % len(handles)]
                url = h["endpoint"].rstrip("/") + "/v1/exec"
                r = http.post(url, headers=h["headers"], json={"command": ["true"]})
                assert r.status_code == 200, r.text

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--execs", type=int, default=200)
    parser.add_argument("--sandboxes", type=int, default=1)
    parser.add_argument("--clients", type=int, default=1)
    parser.add_argument(
        "--idle",
        type=float,
        default=0.0,
        help="count this many seconds with no execs instead (per second, not per exec)",
    )
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--json", help="write the per-function counts per exec here")
    parser.add_argument(
        "--strace",
        metavar="OUT",
        help="also count serve's system calls over the counted execs (strace -c -f) into OUT",
    )
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="podbay-calls-"))
    out = root / "calls.json"
    env = {
        "PODBAY_RUNTIME_CLASSES": "container",
        "PODBAY_LOG_LEVEL": "warning",
        "PODBAY_CALLS_OUT": str(out),
        "PODBAY_CAPS_PER_DEPLOYMENT": "100",
        # No hibernation in the middle of the counted execs.
        "PODBAY_RUNTIME_AGENT_HIBERNATE_SECONDS": "600",
    }
    # Not waited for by start: a server that fails its start is stopped too.
    server = CountedServer.start(root, env=env, wait=False)
    try:
        server.wait_ready()
        token = server.create_deployment("calls")
        handles = []
        for i in range(args.sandboxes):
            r = server.attach(token, f"counted-{i}")
            assert r.status_code in (200, 201), r.text
            handles.append(r.json())
        execs(handles, args.clients, 30 * len(handles))  # warm: not counted
        pid = server.pid()
        os.kill(pid, signal.SIGUSR1)
        time.sleep(0.5)
        tracer = None
        if args.strace:
            tracer = subprocess.Popen(["strace", "-c", "-f", "-o", args.strace, "-p", str(pid)])
            time.sleep(1.0)  # attached to every thread
        cpu = threads_cpu_seconds(pid)
        if args.idle:
            time.sleep(args.idle)
        else:
            execs(handles, args.clients, args.execs)
        cpu = threads_cpu_seconds(pid) - cpu
        if tracer is not None:
            tracer.send_signal(signal.SIGINT)
            tracer.wait(30)
        os.kill(pid, signal.SIGUSR2)
        deadline = time.monotonic() + 30
        while not out.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(0.5)
        rows = json.loads(out.read_text())
    finally:
        server.close()
        with contextlib.suppress(Exception):
            remove_tree(root)
    n, unit = (args.idle, "s") if args.idle else (args.execs, "exec")
    python = sum(c for f, _, _, c in rows if f not in ("<builtin>", "<gc>"))
    builtin = sum(c for f, _, _, c in rows if f == "<builtin>")
    print(f"python calls/{unit} {python / n:.1f}, builtin calls/{unit} {builtin / n:.1f}")
    print(f"serve cpu ms/{unit} (with the hook, load-dependent): {cpu / n * 1000:.2f}")
    print("gc:", ", ".join(f"{name} {c}" for f, _, name, c in rows if f == "<gc>"))
    garbage = sorted((row for row in rows if row[0] == "<garbage>"), key=lambda row: -row[3])
    if garbage:
        print("cyclic garbage by type:", ", ".join(f"{r[2]} {r[3] / n:.2f}" for r in garbage[:20]))
    rows = [row for row in rows if row[0] not in ("<gc>", "<garbage>")]
    rows.sort(key=lambda row: -row[3])
    for f, line, name, c in rows[: args.top]:
        print(f"{c / n:8.2f}  {name}  {f}:{line}")
    if args.json:
        Path(args.json).write_text(json.dumps([[f, ln, nm, c / n] for f, ln, nm, c in rows]))


if __name__ == "__main__":
    main()
