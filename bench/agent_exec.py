"""Benchmark the sandbox agent: exec round trip, poll throughput, start-up, RSS.

    .venv/bin/python bench/agent_exec.py [-n 500] [--python /usr/bin/python3.11]

Starts the agent the way the runtime does (staged copy, ``python -I -S``, an
inherited listening unix socket), then, in the same run:

* exec round trip of ``/bin/true`` through the socket (a keep-alive raw
  HTTP/1.1 client, so the figure is the agent's, not a client library's),
  interleaved one for one with a plain fork/exec of ``/bin/true`` from Python
  (``subprocess.run`` and ``os.posix_spawn``), and the ratio of medians;
* poll throughput: MB/s delivered to a client polling a process that writes
  as fast as it can (``yes``);
* time from launch to the first answer, and the agent's idle RSS.

Budgets: exec p50 <= 3 ms and <= 2.5x plain fork/exec (exec is the hottest call,
and the agent should add little to starting the command itself); idle RSS
<= 20 MiB (one agent idles in every sandbox, so it bounds density).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from podbay.runtime.staging import AGENT_ENV, agent_argv, stage


class RawClient:
    """A minimal keep-alive HTTP/1.1 client on a unix socket."""

    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)
        self.buf = b""

    def request(self, method: str, target: str, body: bytes = b"") -> tuple[int, bytes]:
        head = f"{method} {target} HTTP/1.1\r\nHost: agent\r\nContent-Length: {len(body)}\r\n\r\n"
        self.sock.sendall(head.encode() + body)
        while b"\r\n\r\n" not in self.buf:
            self.buf += self.sock.recv(262144)
        head_raw, _, rest = self.buf.partition(b"\r\n\r\n")
        lines = head_raw.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        length = 0
        for line in lines[1:]:
            name, _, value = line.partition(":")
            if name.lower() == "content-length":
                length = int(value)
        while len(rest) < length:
            rest += self.sock.recv(max(262144, length - len(rest)))
        self.buf = rest[length:]
        return status, rest[:length]


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return -1


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def posix_spawn_true() -> None:
    pid = os.posix_spawn("/bin/true", ["/bin/true"], {})
    os.waitpid(pid, 0)


def burst(sock_path: str, pid: int) -> int:
    """RSS a second after 16 concurrent execs that each print 1 MiB."""
    import threading

    body = json.dumps({"command": ["head", "-c", "1048576", "/dev/zero"]}).encode()

    def one() -> None:
        RawClient(sock_path).request("POST", "/v1/exec", body)

    threads = [threading.Thread(target=one) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    time.sleep(1)
    return rss_kib(pid)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=500, help="exec samples (default 500)")
    parser.add_argument(
        "--python",
        default="/usr/bin/python3.11",
        help="interpreter to run the agent with (the image's)",
    )
    parser.add_argument("--poll-seconds", type=float, default=2.0)
    args = parser.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="podbay-bench-"))
    staged = stage(tmp / "staged", python=[args.python])
    workspace = tmp / "workspace"
    workspace.mkdir()
    sock_path = str(tmp / "agent.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(sock_path)
    listener.listen(128)
    started = time.perf_counter()
    proc = subprocess.Popen(
        agent_argv(
            [args.python], staged, "--fd", str(listener.fileno()), "--workspace", str(workspace)
        ),
        pass_fds=(listener.fileno(),),
        env=dict(AGENT_ENV),
    )
    listener.close()
    try:
        client = RawClient(sock_path)
        status, _ = client.request("GET", "/v1/info")
        first_answer_ms = (time.perf_counter() - started) * 1000
        assert status == 200
        time.sleep(0.3)
        idle_rss = rss_kib(proc.pid)

        body = json.dumps({"command": ["/bin/true"]}).encode()
        for _ in range(20):  # warm up both paths
            client.request("POST", "/v1/exec", body)
            subprocess.run(["/bin/true"], check=True)
        agent_ms: list[float] = []
        run_ms: list[float] = []
        spawn_ms: list[float] = []
        for _ in range(args.n):
            t0 = time.perf_counter()
            status, raw = client.request("POST", "/v1/exec", body)
            t1 = time.perf_counter()
            subprocess.run(["/bin/true"], check=True)
            t2 = time.perf_counter()
            posix_spawn_true()
            t3 = time.perf_counter()
            assert status == 200, raw
            assert json.loads(raw)["exit_code"] == 0, raw
            agent_ms.append((t1 - t0) * 1000)
            run_ms.append((t2 - t1) * 1000)
            spawn_ms.append((t3 - t2) * 1000)
        after_exec_rss = rss_kib(proc.pid)

        status, raw = client.request(
            "POST", "/v1/processes", json.dumps({"command": ["yes", "a" * 63]}).encode()
        )
        process_id = json.loads(raw)["process_id"]
        delivered = 0
        polls = 0
        offset = 0
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < args.poll_seconds:
            status, raw = client.request("GET", f"/v1/processes/{process_id}?stdout_from={offset}")
            out = json.loads(raw)
            delivered += len(out["stdout"])
            offset = out["stdout_next"]
            polls += 1
        elapsed = time.perf_counter() - t0
        client.request("DELETE", f"/v1/processes/{process_id}")
        produced = offset
        poll_rss = rss_kib(proc.pid)
        burst_rss = burst(sock_path, proc.pid)
    finally:
        proc.terminate()
        proc.wait(5)

    p50_agent, p50_run, p50_spawn = (statistics.median(v) for v in (agent_ms, run_ms, spawn_ms))
    rows = [
        ("exec /bin/true via agent socket", p50_agent, pct(agent_ms, 0.99)),
        ("subprocess.run(/bin/true)", p50_run, pct(run_ms, 0.99)),
        ("os.posix_spawn(/bin/true)+waitpid", p50_spawn, pct(spawn_ms, 0.99)),
    ]
    print(f"agent exec round trip, n={args.n}, interleaved (ms)")
    print(f"  {'':36} {'p50':>7} {'p99':>7}")
    for name, p50, p99 in rows:
        print(f"  {name:36} {p50:7.2f} {p99:7.2f}")
    print(f"  ratio agent / subprocess.run p50:   {p50_agent / p50_run:7.2f}x")
    print(f"  ratio agent / posix_spawn p50:      {p50_agent / p50_spawn:7.2f}x")
    print("poll throughput (yes, polled back to back)")
    print(
        f"  delivered {delivered / elapsed / 1e6:8.1f} MB/s over {polls} polls "
        f"({delivered / max(polls, 1) / 1024:.0f} KiB/poll); produced "
        f"{produced / elapsed / 1e6:.1f} MB/s, dropped {produced - delivered} bytes"
    )
    print("agent process")
    print(f"  launch to first answer  {first_answer_ms:7.1f} ms  ({args.python} -I -S)")
    print(f"  idle RSS                {idle_rss / 1024:7.1f} MiB")
    print(f"  RSS after execs         {after_exec_rss / 1024:7.1f} MiB")
    print(f"  RSS after poll run      {poll_rss / 1024:7.1f} MiB")
    print(
        f"  RSS after a burst       {burst_rss / 1024:7.1f} MiB  "
        "(16 concurrent execs printing 1 MiB each, 1 s later)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
