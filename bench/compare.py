"""podbay (A) against Docker or an older podbay (B, C), interleaved, and the machine's floors.

    .venv/bin/python bench/docker_setup.py start              # Docker, for B and C
    .venv/bin/python bench/compare.py [--runs 15] [--mib 100] [--json]
    .venv/bin/python bench/docker_setup.py stop [--purge]
    .venv/bin/python bench/compare.py --against OLD/src      # before/after (and Docker)
    .venv/bin/python bench/compare.py --no-docker            # podbay and floors only

Column A is this checkout: a real ``podbay serve`` (``podbay.testing.platform``:
real sandboxes, needs root and the base image) with one class enabled,
``--class`` (default ``gvisor``, podbay's default class), started twice, with
the default warm pool of 2 and with none, and the SDK and CLI of this
checkout. Docker's column is the runtime that matches the class: ``runc``
for ``container``, ``runsc`` for ``gvisor``; ``vm`` has no Docker
counterpart and runs alone. (Before, both servers were ``container`` whatever
Docker column they stood beside.)
The other columns, when there are any, run in the same loop, sample for
sample (A B C A B C ...), so that a machine shared with other work slows
them all alike; ``A/B`` is the median of the pairwise ratios. They are:

* ``--against SRC``: podbay from another checkout's ``src`` (e.g. ``git
  archive OLD src | tar -x -C /tmp/old``), in a child process of this script
  with ``PYTHONPATH=SRC``: its server, agent, SDK, and its CLI as
  ``--against-cli`` (default ``python -m podbay.cli.main``), on
  ``--against-class`` (default ``--class``: ``--against src
  --against-class container`` sets two classes of this checkout side by side);
* and Docker Engine (unless ``--no-docker``), where it answers on
  ``/var/run/docker.sock`` and
  has ``--docker-image`` locally: one column per ``--docker-runtimes`` the
  daemon has (default: the class's runtime). ``bench/docker_setup.py``
  starts such a daemon (Debian's docker.io, 20.10) with podbay's base image
  imported as ``podbay-base``, without a bridge: Docker's containers have no
  network (``NetworkMode: none``) where podbay's have one, and runsc runs on
  the ptrace platform (the only one this runsc has that runs here).

Without a B the table holds podbay's rows; the physical floors of this
machine are printed in every case:

* spawn: ``posix_spawn`` + ``waitpid`` of ``/bin/true`` from Python;
* loopback HTTP: one keep-alive request/response over TCP loopback between
  two threads of this process (``http.client`` against a raw-socket server);
* host ``cp`` of the same file (page-cached source, same filesystem);
* Python start-up: ``python -I -S -c pass`` and ``python -c pass`` (what any
  Python CLI pays before its first import).

Rows (medians of ``--runs`` samples unless said):

* new sandbox → first output: ``attach`` of a new name + ``exec echo``, SDK,
  1 s apart (a warm pool refills between conversations); Docker: API create
  + start + exec (the same in both rows: it has no pool), and ``docker run
  --rm IMAGE echo hi`` as a whole command in the note below the table;
* first exec on a sandbox handed out by the warm pool, beside its second and
  an exec on the running sandbox just before the attach (all three run while
  the pool refills after the previous sample's hand-out, when that takes more
  than the pause: a loaded 2-core machine starting a sandbox slows every exec);
* exec ``true`` in a running sandbox, SDK (10x ``--runs``); Docker: API;
* suspend / resume: ``stop`` then ``attach`` (control-plane API, SDK);
  Docker: pause / unpause; podbay's samples of these, of the new pooled
  sandbox and of the pooled first exec also give the CPU ms the server's
  threads spent meanwhile (``suspend serve cpu ms`` ..., after the table);
* read 100 MiB (``--runs``/3): SDK ``download`` of the file written at set-up,
  and a GET straight from the agent's socket; Docker: ``docker cp`` out and
  the API's ``GET /containers/ID/archive``; with the CPU ms each cost, as
  the writes';
* write 100 MiB (``--runs``/3): SDK ``upload`` of a page-cached file (its
  digest included), and a PUT straight to the agent's socket with the digest
  computed beforehand (the agent's write path alone); Docker: ``docker cp``
  and the API's ``PUT /containers/ID/archive`` of a tar made while sending;
  podbay's samples also give the CPU ms each cost the SDK's process, the
  server and the agent (``write_sdk cpu agent`` ..., after the table), which
  load inflates far less than time; both over-write the same file each time,
  as a client updating a file does;
* ``podbay sandbox exec NAME -- true``: the CLI as a whole process, its
  bytecode cached as in an installed package; Docker: ``docker exec``;
* exec throughput: 8 client threads over 20 running sandboxes, 5 s,
  ``--runs``/3 times (one 5-s sample moved the ratio by 20 % on the loaded
  machine); podbay's also give the server's CPU ms per exec
  (``serve_ms_per_exec``, the execs' alone), which load inflates less than
  the rate; Docker: API exec create + start;
* first exec after idling past the agent's hibernation delay (podbay's
  servers here hibernate an idle agent after ``HIBERNATE_SECONDS``; the
  default is 300 s), beside its second;
* host memory per idle sandbox: the PSS of the sandbox's host processes (those
  in its machine's cgroups: runc's agent; gVisor's sentry, gofer and ptrace
  stubs, each also apart; a vm's QEMU) + its slirp4netns's, median of 10
  idle sandboxes, ``--runs``/5 times, once past the hibernation delay (an
  awake agent's PSS, right after an exec, beside it); Docker: the PSS of
  the container's containerd shim and every process below it (runc: the
  container's ``sleep``; runsc: its gofer, its sandbox and the ptrace
  platform's stub processes), median of 10 of its 20 idle containers.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import http.client
import json
import os
import shutil
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx

from docker_setup import DOCKER_CLI, IMAGE, SOCKET
from podbay import SandboxClient
from podbay.testing.platform import PlatformServer

MIB = 1024 * 1024
ROOT = Path(__file__).resolve().parent.parent
PODBAY = [str(Path(sys.executable).with_name("podbay"))]
DOCKER_SOCKET = SOCKET
#: podbay's servers here hibernate an idle agent after this many seconds.
HIBERNATE_SECONDS = 3.0
#: The 100 MiB file in the sandbox the read rows read (written at set-up).
WARM = "/workspace/warm.bin"
#: Execs that bring a sandbox woken from hibernation back to "in use" before an
#: exec on it is timed as a running sandbox's: a pooled machine's warm-up count
#: (``WARM_UP_EXECS``; not imported, so that the worker runs older checkouts).
WAKE_EXECS = 10

Sample = Callable[[], float]


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def timed(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def rate(clients: int, seconds: float, worker: Callable[[Iterator[int]], None]) -> float:
    """Calls per second of ``clients`` threads for ``seconds``, both sides alike:
    each runs ``worker`` over its call numbers (i, i + clients, ...), one call
    each, until time is up."""
    count = [0] * clients
    stop_at = time.perf_counter() + seconds

    def calls(i: int) -> Iterator[int]:
        k = i
        while time.perf_counter() < stop_at:
            yield k
            count[i] += 1
            k += clients

    threads = [threading.Thread(target=worker, args=(calls(i),)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sum(count) / seconds


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system) process ``pid`` has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def process_seconds(pid: str) -> float:
    """User + system CPU seconds of a process (all its threads, live and gone)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def threads_cpu_ms(pid: int) -> float:
    """CPU ms the live threads of process ``pid`` have used so far, from the
    scheduler's nanosecond counts (``/proc/PID/task/*/schedstat``): fine enough
    for one operation of a few ms, where ``/proc/PID/stat`` counts 10 ms ticks."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            total += int((task / "schedstat").read_text().split()[0])
    return total / 1e6


def machine_pids(machine_id: str) -> list[int]:
    """Processes in a cgroup of machine ``machine_id`` (a path segment of that
    name: runc's and runsc's container cgroup, a vm's QEMU cgroup)."""
    out = []
    for e in os.scandir("/proc"):
        if not e.name.isdigit():
            continue
        try:
            text = Path(f"/proc/{e.name}/cgroup").read_text()
        except OSError:
            continue
        if any(machine_id in line.rpartition(":")[2].split("/") for line in text.splitlines()):
            out.append(int(e.name))
    return out


def process_kind(pid: int) -> str:
    """What a sandbox's host process is: its program's name (``stub`` for
    gVisor's ptrace stubs, which show as ``[exe]`` or an empty command line)."""
    argv = cmdline(pid)
    name = os.path.basename(argv[0]) if argv else ""
    if not name or name.startswith("["):
        return "stub"
    if name.startswith("qemu"):
        return "qemu"
    if name.startswith("runsc"):
        return name.split()[0]
    if name.startswith("slirp4netns"):
        return "slirp4netns"  # in the machine's cgroup too: counted as ``slirp`` alone
    return "agent"


def cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def pids_matching(predicate: Callable[[list[str]], bool]) -> list[int]:
    return [
        int(e.name)
        for e in os.scandir("/proc")
        if e.name.isdigit() and predicate(cmdline(int(e.name)))
    ]


class Row:
    """One line of the table: each column's samples (A, B, C, ...), in one unit."""

    def __init__(
        self, name: str, unit: str, scale: float = 1000.0, higher_is_better: bool = False
    ) -> None:
        self.name, self.unit, self.scale = name, unit, scale
        self.higher_is_better = higher_is_better
        self.columns: list[list[float]] = [[]]

    @property
    def podbay(self) -> list[float]:
        return self.columns[0]

    def column(self, i: int) -> list[float]:
        while len(self.columns) <= i:
            self.columns.append([])
        return self.columns[i]

    def run(self, podbay: Sample, other: Sample | None, runs: int) -> Row:
        for _ in range(runs):
            self.column(0).append(podbay() * self.scale)
            if other is not None:
                self.column(1).append(other() * self.scale)
        return self

    def as_dict(self) -> dict[str, Any]:
        """``a``, and for each further column with samples its median (``b``,
        ``c``, ...) and the median of the pairwise ratios (``a/b``, ``a/c``)."""
        out: dict[str, Any] = {
            "row": self.name,
            "unit": self.unit,
            "n": len(self.podbay),
            "a": round(median(self.podbay), 3),
        }
        for i, samples in enumerate(self.columns[1:], start=1):
            if not samples:
                continue
            letter = COLUMNS[i]
            out[letter] = round(median(samples), 3)
            pairs = [a / b for a, b in zip(self.podbay, samples, strict=False) if b]
            out[f"a/{letter}"] = round(median(pairs), 3)
        return out


COLUMNS = "abcdefgh"


# -- floors ---------------------------------------------------------------------------


def floor_spawn() -> float:
    started = time.perf_counter()
    pid = os.posix_spawn("/bin/true", ["true"], os.environ)
    os.waitpid(pid, 0)
    return time.perf_counter() - started


@contextlib.contextmanager
def loopback_server() -> Iterator[int]:
    """A keep-alive HTTP server that answers every request with a fixed 200."""
    listener = socket.create_server(("127.0.0.1", 0))
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Type: text/plain\r\n\r\nok"

    def serve() -> None:
        with contextlib.suppress(OSError):
            while True:
                conn, _ = listener.accept()
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                buf = b""
                while True:
                    data = conn.recv(65536)
                    if not data:
                        break
                    buf += data
                    while b"\r\n\r\n" in buf:
                        head, buf = buf.split(b"\r\n\r\n", 1)
                        length = 0
                        for line in head.split(b"\r\n")[1:]:
                            key, _, value = line.partition(b":")
                            if key.strip().lower() == b"content-length":
                                length = int(value)
                        while len(buf) < length:
                            buf += conn.recv(65536)
                        buf = buf[length:]
                        conn.sendall(answer)
                conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        listener.close()


def python_start(flags: list[str]) -> Sample:
    return lambda: timed(lambda: subprocess.run([sys.executable, *flags, "-c", "pass"], check=True))


# -- podbay ---------------------------------------------------------------------------


class Podbay:
    """One ``podbay serve`` and an SDK client on it."""

    def __init__(self, warm_pool: int, klass: str) -> None:
        root = self.root = Path(tempfile.mkdtemp(prefix="podbay-compare-"))
        self.klass = klass
        env = {
            # The one class measured: attach without a class gets it.
            "PODBAY_RUNTIME_CLASSES": klass,
            "PODBAY_RUNTIME_WARM_POOL": str(warm_pool),
            "PODBAY_CAPS_PER_DEPLOYMENT": "100",
            "PODBAY_CAPS_PER_ACCOUNT": "100",
            "PODBAY_LOG_LEVEL": "warning",
            "PODBAY_RUNTIME_AGENT_HIBERNATE_SECONDS": str(HIBERNATE_SECONDS),
        }
        self.server = PlatformServer.start(root, env=env)
        self.token = self.server.create_deployment("compare")
        self.client = SandboxClient(identity_token=self.token, server_url=self.server.base_url)
        self.counter = 0
        #: Between new sandboxes: time for a warm pool to refill, as between conversations.
        self.pause = 1.0 if warm_pool else 0.1

    def close(self) -> None:
        try:
            from podbay.host.storage import remove_tree
        except ImportError:  # a --against tree from before podbay.host
            from podbay.runtime.oci.storage import remove_tree  # type: ignore[no-redef,import-not-found]

        self.client.close()
        self.server.close()
        # Its data and log (template disks, the agent: tens of MB a run); never
        # while anything is still mounted there (remove_tree refuses).
        with contextlib.suppress(Exception):
            remove_tree(self.root)

    def fresh_name(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}-{self.counter}"

    def machine_id(self, name: str) -> str:
        handle = self.client.attach(name)
        sandbox_id = handle.endpoint.rstrip("/").rsplit("/", 1)[1]
        with sqlite3.connect(self.server.data_dir / "podbay.db") as db:
            (machine_id,) = db.execute(
                "SELECT machine_id FROM sandboxes WHERE id=?", (sandbox_id,)
            ).fetchone()
        return str(machine_id)

    def driver(self) -> Any:
        from podbay.runtime.classes import build_driver
        from podbay.settings import Settings

        settings = Settings.load(environ={**self.server.env}, data_dir=self.server.data_dir)
        return build_driver(settings, self.klass)  # with the class's own settings

    def sandbox_pids(self, name: str) -> list[int]:
        """The host processes of sandbox ``name`` (its machine's cgroups): runc's
        agent; gVisor's sentry, gofer and ptrace stubs; a vm's QEMU."""
        return machine_pids(self.machine_id(name))

    def agent_socket(self, name: str) -> str:
        return str(self.driver().agent_socket(self.machine_id(name)))

    def new_to_first_output(self) -> float:
        name = self.fresh_name("new")
        started = time.perf_counter()
        self.client.attach(name)
        result = self.client.exec(name, ["echo", "hi"])
        took = time.perf_counter() - started
        assert result.stdout == "hi\n", result
        self.client.delete(name)
        time.sleep(self.pause)
        return took

    def first_exec_pooled(self, running: str) -> tuple[float, float, float]:
        """The first and second exec on a sandbox the pool handed out, and one on
        the running sandbox ``running`` just before the hand-out: a pool refill
        still under way (its machine's start) slows all three alike. ``running``
        is woken first (idle past HIBERNATE_SECONDS, its agent hibernated: with
        a second column, more than half the rounds) and given as many execs
        as a pooled machine's warm-up: a just-woken agent's interpreter is as
        cold as a new one's (measured: ~0.3 ms more agent CPU on its second
        exec than after ten), and the row is an exec on a sandbox in use."""
        for _ in range(WAKE_EXECS):
            self.client.exec(running, ["true"])
        beside = timed(lambda: self.client.exec(running, ["true"]))
        name = self.fresh_name("pooled")
        self.client.attach(name)
        first = timed(lambda: self.client.exec(name, ["true"]))
        second = timed(lambda: self.client.exec(name, ["true"]))
        self.client.delete(name)
        time.sleep(self.pause)
        return first, second, beside

    def awake(self, names: list[str]) -> list[Any]:
        """Handles of ``names``, every agent awake and its idle clock just
        restarted: past the first sample, the other side's turn outlasts
        HIBERNATE_SECONDS, and a rate would count wake-ups instead of execs in
        running sandboxes. One exec in each, side by side, until such a pass
        takes under a third of the delay: woken one after another on a loaded
        machine (20 wake-ups, 50-250 ms each) the first ones hibernated again
        before the clock started, a share of the sample's execs that varied with
        the load of the moment (server, agent and client CPU per exec alike)."""
        handles = [self.client.attach(n) for n in names]
        for _ in range(5):
            started = time.perf_counter()
            threads = [threading.Thread(target=self.client.exec, args=(n, ["true"])) for n in names]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            if time.perf_counter() - started < HIBERNATE_SECONDS / 3:
                break
        return handles

    def throughput(self, handles: list[Any], clients: int, seconds: float) -> float:
        """Execs per second of ``clients`` threads over the sandboxes of ``handles``
        (see :meth:`awake`), straight to the gateway."""

        def worker(calls: Iterator[int]) -> None:
            with httpx.Client(timeout=30) as http:
                for k in calls:
                    h = handles[k % len(handles)]
                    r = http.post(
                        h.endpoint.rstrip("/") + "/v1/exec",
                        headers=h.headers,
                        json={"command": ["true"]},
                    )
                    assert r.status_code == 200, r.text

        return rate(clients, seconds, worker)

    def wake_exec(self, name: str) -> tuple[float, float]:
        """The first exec after idling past the hibernation delay, and the second."""
        self.client.exec(name, ["true"])
        time.sleep(HIBERNATE_SECONDS + 2)
        first = timed(lambda: self.client.exec(name, ["true"]))
        second = timed(lambda: self.client.exec(name, ["true"]))
        return first, second

    def idle_memory_kib(self, names: list[str], settle: float) -> dict[str, float]:
        """Median PSS per sandbox, KiB, ``settle`` s after an exec in each: its
        host processes (``sandbox``) and its slirp4netns (``slirp``), and each
        kind of host process apart (``pss <kind>``: ``agent`` under runc,
        ``runsc-sandbox`` (the sentry, which holds the agent), ``runsc-gofer``
        and ``stub`` (ptrace's) under gVisor, ``qemu`` for a vm)."""
        # Looked up first: an API call after the pause would go out on a kept
        # connection the server's 5-s keep-alive may be closing (a reset).
        machine_ids = {n: self.machine_id(n) for n in names}
        for n in names:
            self.client.exec(n, ["true"])
        time.sleep(settle)
        parts: dict[str, list[float]] = {}
        for n in names:
            machine_id = machine_ids[n]
            kinds: dict[str, float] = {}
            for pid in machine_pids(machine_id):
                kind = process_kind(pid)
                if kind == "slirp4netns":
                    continue  # its slirp4netns, found below whichever cgroup it is in
                kinds[kind] = kinds.get(kind, 0) + pss_kib(pid)
            kinds["sandbox"] = sum(kinds.values())
            found = pids_matching(
                lambda argv, m=machine_id: (
                    bool(argv) and argv[0].endswith("slirp4netns") and any(m in a for a in argv)
                )
            )
            kinds["slirp"] = sum(pss_kib(p) for p in found)
            for kind, kib in kinds.items():
                parts.setdefault(kind, []).append(kib)
        return {kind: median(values) for kind, values in parts.items()}

    def awake_agent_kib(self, names: list[str]) -> float:
        """Median PSS of a sandbox's host processes, KiB, each measured right after
        an exec (before its agent could hibernate)."""
        pids = {
            n: [p for p in self.sandbox_pids(n) if process_kind(p) != "slirp4netns"] for n in names
        }
        totals = []
        for n in names:
            self.client.exec(n, ["true"])
            totals.append(sum(pss_kib(p) for p in pids[n]))
        return median(totals)

    def cli_exec(self, name: str) -> float:
        env = {
            **os.environ,
            "ASTRO_AUTHZ_TOKEN": self.token,
            "PODBAY_SERVER_URL": self.server.base_url,
            # Bytecode cached, as an installed package has it (pip compiles it
            # at install): an editable install under PYTHONDONTWRITEBYTECODE
            # compiles podbay's modules at every start. Kept out of the tree.
            "PYTHONDONTWRITEBYTECODE": "",
            "PYTHONPYCACHEPREFIX": str(self.root / "pycache"),
        }
        started = time.perf_counter()
        # No stdin, as typed at a terminal (and as `docker exec` without -i).
        done = subprocess.run(
            [*PODBAY, "sandbox", "exec", name, "--", "true"],
            env=env,
            capture_output=True,
            stdin=subprocess.DEVNULL,
        )
        took = time.perf_counter() - started
        assert done.returncode == 0, done.stderr
        return took


def write_to_agent(sock: str, source: Path, digest: str, size: int) -> float:
    conn = UnixHTTPConnection(sock)
    started = time.perf_counter()
    conn.putrequest("PUT", "/v1/files?path=/workspace/direct.bin")
    conn.putheader("X-Podbay-Sha256", digest)
    conn.putheader("Content-Length", str(size))
    conn.endheaders()
    with open(source, "rb") as f:
        while chunk := f.read(MIB):
            conn.send(chunk)
    response = conn.getresponse()
    body = response.read()
    took = time.perf_counter() - started
    conn.close()
    assert response.status == 200, body
    return took


def read_from_agent(sock: str, path: str, size: int) -> float:
    """GET the file straight from the agent's socket, read to the end."""
    conn = UnixHTTPConnection(sock)
    started = time.perf_counter()
    conn.request("GET", f"/v1/files?path={path}")
    response = conn.getresponse()
    got = 0
    while chunk := response.read(MIB):
        got += len(chunk)
    took = time.perf_counter() - started
    conn.close()
    assert response.status == 200, (response.status, got)
    assert got == size, (response.status, got)
    return took


class UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("agent", timeout=120)
        self.path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(self.path)


# -- Docker ---------------------------------------------------------------------------


class Docker:
    """Docker Engine through its API socket (v1.41, Engine 20.10) and its CLI, on
    one runtime (``runc``, ``runsc``). Containers have no network: the daemon of
    ``bench/docker_setup.py`` has no bridge (it must not touch this machine's
    firewall), so every container is ``NetworkMode: none``."""

    def __init__(self, image: str, runtime: str, cli: str) -> None:
        self.image, self.runtime, self.cli_path = image, runtime, cli
        self.api = httpx.Client(
            transport=httpx.HTTPTransport(uds=DOCKER_SOCKET),
            base_url="http://docker/v1.41",
            timeout=120,
        )
        self.containers: list[str] = []

    @staticmethod
    def runtimes(image: str) -> list[str]:
        """The runtimes of the daemon on :data:`DOCKER_SOCKET`, [] when there is
        none or it lacks ``image``."""
        if not os.path.exists(DOCKER_SOCKET):
            return []
        try:
            with httpx.Client(
                transport=httpx.HTTPTransport(uds=DOCKER_SOCKET), base_url="http://docker/v1.41"
            ) as api:
                if api.get(f"/images/{image}/json").status_code != 200:
                    print(
                        f"docker: no image {image} (bench/docker_setup.py start imports it); "
                        "Docker rows skipped",
                        file=sys.stderr,
                    )
                    return []
                return sorted(api.get("/info").json().get("Runtimes", {}))
        except httpx.TransportError:
            return []

    def version(self) -> str:
        return str(self.api.get("/version").json().get("Version", "?"))

    def create_started(self) -> str:
        r = self.api.post(
            "/containers/create",
            json={
                "Image": self.image,
                "Cmd": ["sleep", "infinity"],
                "Labels": {"podbay-bench": "compare"},
                "HostConfig": {"NetworkMode": "none", "Runtime": self.runtime},
            },
        )
        ok(r)
        cid = str(r.json()["Id"])
        self.containers.append(cid)
        ok(self.api.post(f"/containers/{cid}/start"))
        return cid

    def exec(self, cid: str, argv: list[str], api: httpx.Client | None = None) -> bytes:
        """Exec create + start, attached: the answer to start is the command's
        output (multiplexed) until it exits, and then the daemon closes the
        connection."""
        api = api or self.api
        r = api.post(
            f"/containers/{cid}/exec",
            json={"Cmd": argv, "AttachStdout": True, "AttachStderr": True},
        )
        ok(r)
        out = ok(api.post(f"/exec/{r.json()['Id']}/start", json={"Detach": False, "Tty": False}))
        return out.content

    def put_archive(self, cid: str, source: Path, name: str) -> float:
        """PUT /containers/ID/archive: a tar of one file, made while it is sent
        (as ``docker cp`` does), into /workspace. With its length given: a
        chunked body cost the daemon (and httpx) about half as much again."""
        info = tarfile.TarInfo(name)
        info.size = source.stat().st_size
        info.mode = 0o644
        info.mtime = int(time.time())
        head = info.tobuf(format=tarfile.PAX_FORMAT)
        tail = b"\0" * (-info.size % tarfile.BLOCKSIZE + 2 * tarfile.BLOCKSIZE)

        def body() -> Iterator[bytes]:
            yield head
            with open(source, "rb") as f:
                while chunk := f.read(MIB):
                    yield chunk
            yield tail

        started = time.perf_counter()
        r = self.api.put(
            f"/containers/{cid}/archive",
            params={"path": "/workspace"},
            content=body(),
            headers={
                "Content-Type": "application/x-tar",
                "Content-Length": str(len(head) + info.size + len(tail)),
            },
        )
        took = time.perf_counter() - started
        ok(r)
        return took

    def get_archive(self, cid: str, path: str) -> float:
        """GET /containers/ID/archive of one file (a tar stream), read to the end."""
        started = time.perf_counter()
        with self.api.stream("GET", f"/containers/{cid}/archive", params={"path": path}) as r:
            ok(r)
            for _ in r.iter_bytes(MIB):
                pass
        return time.perf_counter() - started

    def remove(self, cid: str) -> None:
        self.api.delete(f"/containers/{cid}", params={"force": "true"})
        with contextlib.suppress(ValueError):
            self.containers.remove(cid)

    def close(self) -> None:
        for cid in list(self.containers):
            self.remove(cid)
        self.api.close()

    def new_to_first_output(self) -> float:
        started = time.perf_counter()
        cid = self.create_started()
        out = self.exec(cid, ["echo", "hi"])
        took = time.perf_counter() - started
        assert b"hi" in out, out
        self.remove(cid)
        return took

    def run_echo(self) -> float:
        """``docker run --rm IMAGE echo hi``: the CLI's new container to first output."""
        started = time.perf_counter()
        done = self.cli(
            "run", "--rm", "--network=none", f"--runtime={self.runtime}", self.image, "echo", "hi"
        )
        took = time.perf_counter() - started
        assert done.stdout == b"hi\n", done
        return took

    def throughput(self, cids: list[str], clients: int, seconds: float) -> float:
        def worker(calls: Iterator[int]) -> None:
            with self.client() as api:
                for k in calls:
                    self.exec(cids[k % len(cids)], ["true"], api)

        return rate(clients, seconds, worker)

    def client(self) -> httpx.Client:
        return httpx.Client(
            transport=httpx.HTTPTransport(uds=DOCKER_SOCKET),
            base_url="http://docker/v1.41",
            timeout=120,
        )

    def idle_memory_kib(self, cids: list[str], settle: float) -> float:
        """Median per container of the PSS of its containerd shim and every
        process below it: runc's container init, or runsc's gofer, sandbox
        (the Sentry) and its platform's stub processes."""
        time.sleep(settle)
        children: dict[int, list[int]] = {}
        for pid in pids_matching(lambda argv: True):
            children.setdefault(parent_pid(pid), []).append(pid)
        totals = []
        for cid in cids:
            shims = pids_matching(
                lambda argv, c=cid: bool(argv) and "containerd-shim" in argv[0] and c in argv
            )
            tree, todo = [], list(shims)
            while todo:
                pid = todo.pop()
                tree.append(pid)
                todo.extend(children.get(pid, []))
            totals.append(sum(pss_kib(p) for p in tree))
        return median(totals)

    def cli(self, *args: str) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(
            [self.cli_path, *args], check=True, capture_output=True, stdin=subprocess.DEVNULL
        )

    def timed_cli(self, *args: str) -> float:
        return timed(lambda: self.cli(*args))


def ok(response: httpx.Response) -> httpx.Response:
    """``response``, or an error that carries the daemon's message."""
    if response.is_error:
        raise RuntimeError(
            f"docker: {response.request.method} {response.request.url.path}: "
            f"{response.status_code} {response.text.strip()}"
        )
    return response


def parent_pid(pid: int) -> int:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return 0
    return int(stat.rsplit(")", 1)[1].split()[1])


# -- the run ----------------------------------------------------------------------------


def make_source(directory: Path, mib: int) -> tuple[Path, str, int]:
    source = directory / "source.bin"
    block = os.urandom(MIB)
    digest = hashlib.sha256()
    with open(source, "wb") as f:
        for i in range(mib):
            chunk = block[i:] + block[:i]
            f.write(chunk)
            digest.update(chunk)
    return source, digest.hexdigest(), mib * MIB


#: (key, label, unit, scale, samples as a share of --runs, higher is better)
ROWS: list[tuple[str, str, str, float, float, bool]] = [
    ("new_pool", "new sandbox -> first output, warm pool (API)", "ms", 1000, 1, False),
    ("new_cold", "new sandbox -> first output, no pool (API)", "ms", 1000, 1, False),
    ("first_exec", "first exec on a pooled sandbox", "ms", 1000, 1, False),
    ("second_exec", "  (its second exec)", "ms", 1000, 0, False),
    ("beside_exec", "  (an exec on a running sandbox just before)", "ms", 1000, 0, False),
    ("exec_hot", "exec `true`, running sandbox (SDK / API)", "ms", 1000, 10, False),
    ("suspend", "suspend (stop / pause)", "ms", 1000, 1, False),
    ("resume", "resume (attach / unpause)", "ms", 1000, 0, False),
    ("write_sdk", "write {mib} MiB, SDK upload (docker cp)", "ms", 1000, 1 / 3, False),
    ("write_agent", "write {mib} MiB, to the agent (API PUT archive)", "ms", 1000, 1 / 3, False),
    ("read_sdk", "read {mib} MiB, SDK download (docker cp)", "ms", 1000, 1 / 3, False),
    ("read_agent", "read {mib} MiB, from the agent (API GET archive)", "ms", 1000, 1 / 3, False),
    ("cli", "`podbay sandbox exec NAME -- true` (docker exec)", "ms", 1000, 1, False),
    ("throughput", "exec throughput, 20 sandboxes, 8 clients", "/s", 1, 1 / 3, True),
    ("wake", "first exec after idling past hibernation", "ms", 1000, 1 / 3, False),
    ("wake_second", "  (its second exec)", "ms", 1000, 0, False),
    ("memory", "host memory per idle sandbox", "MiB", 1, 0.2, False),
]


class PodbaySide:
    """podbay's rows: two servers (warm pool 2, none), an SDK client, sandboxes."""

    def __init__(self, source: Path, digest: str, size: int, klass: str) -> None:
        self.source, self.digest, self.size = source, digest, size
        self.pooled = Podbay(warm_pool=2, klass=klass)
        self.cold = Podbay(warm_pool=0, klass=klass)
        self.client = self.pooled.client
        self.client.attach("hot")
        for _ in range(30):
            self.client.exec("hot", ["true"])
        self.client.upload("hot", source, WARM)  # page cache, first-write costs; read rows
        self.sock = self.pooled.agent_socket("hot")
        hot = self.pooled.sandbox_pids("hot")
        #: Whose CPU a write costs (load inflates it far less than time); the
        #: agent's is its sandbox's host processes' (gVisor's sentry and gofer).
        self.cpu_of: dict[str, Callable[[], float]] = {
            "sdk": lambda: process_seconds("self"),
            "server": lambda: process_seconds(str(self.pooled.server.pid())),
            "agent": lambda: sum(process_seconds(str(p)) for p in hot),
        }
        self.scratch = Path(tempfile.mkdtemp(prefix="podbay-compare-read-"))
        #: The throughput and memory rows' sandboxes, started for the first of
        #: them (20 vm machines are not started for a run without those rows).
        self._many = [f"tp-{i}" for i in range(20)]
        self.client.attach("sleeper")
        time.sleep(1.0)  # the pool fills

    @property
    def many(self) -> list[str]:
        if self._many and not getattr(self, "_many_started", False):
            for n in self._many:
                self.client.attach(n)
            self._many_started = True
        return self._many

    def close(self) -> None:
        self.pooled.close()
        self.cold.close()
        shutil.rmtree(self.scratch, ignore_errors=True)

    def with_cpu(self, key: str, sample: Sample) -> dict[str, float]:
        """``sample``'s time, and the CPU ms it cost the SDK's process, the server
        and the agent (``<key> cpu <whose>``)."""
        before = {whose: cpu() for whose, cpu in self.cpu_of.items()}
        out = {key: sample()}
        for whose, cpu in self.cpu_of.items():
            out[f"{key} cpu {whose}"] = (cpu() - before[whose]) * 1000
        return out

    def server_cpu(self, key: str, sample: Sample) -> dict[str, float]:
        """``sample``'s time, and the CPU ms the pooled server's threads spent
        meanwhile (``<key> serve cpu ms``): load inflates it far less than time,
        and it is all of a suspend's or resume's work but the kernel's freezer."""
        serve = self.pooled.server.pid()
        spent = threads_cpu_ms(serve)
        took = sample()
        return {key: took, f"{key} serve cpu ms": threads_cpu_ms(serve) - spent}

    def sample(self, key: str) -> dict[str, float]:
        c = self.client
        if key == "new_pool":
            return self.server_cpu(key, self.pooled.new_to_first_output)
        if key == "new_cold":
            return {key: self.cold.new_to_first_output()}
        if key == "first_exec":
            serve = self.pooled.server.pid()
            spent = threads_cpu_ms(serve)
            first, second, beside = self.pooled.first_exec_pooled("hot")
            return {
                "first_exec": first,
                "second_exec": second,
                "beside_exec": beside,
                # With the attach and delete around them (and any pool refill).
                "first_exec serve cpu ms": threads_cpu_ms(serve) - spent,
            }
        if key == "exec_hot":
            return {key: timed(lambda: c.exec("hot", ["true"]))}
        if key == "suspend":
            return {
                **self.server_cpu("suspend", lambda: timed(lambda: c.stop("hot"))),
                **self.server_cpu("resume", lambda: timed(lambda: c.attach("hot"))),
            }
        if key == "write_sdk":
            return self.with_cpu(
                key, lambda: timed(lambda: c.upload("hot", self.source, "bench.bin"))
            )
        if key == "write_agent":
            return self.with_cpu(
                key, lambda: write_to_agent(self.sock, self.source, self.digest, self.size)
            )
        if key == "read_sdk":
            target = self.scratch / "read.bin"
            took = self.with_cpu(key, lambda: timed(lambda: c.download("hot", WARM, target)))
            assert target.stat().st_size == self.size
            target.unlink()
            return took
        if key == "read_agent":
            return self.with_cpu(key, lambda: read_from_agent(self.sock, WARM, self.size))
        if key == "cli":
            return {key: self.pooled.cli_exec("hot")}
        if key == "throughput":
            # Also the server's CPU per exec: a figure a loaded machine inflates
            # far less than the rate, for A/B runs under load.
            # The execs' alone: not the attaches and wake-ups before the clock.
            handles = self.pooled.awake(self.many)
            serve = self.pooled.server.pid()
            spent = cpu_seconds(serve)
            per_second = self.pooled.throughput(handles, 8, 5.0)
            spent = cpu_seconds(serve) - spent
            return {key: per_second, "serve_ms_per_exec": spent / (per_second * 5.0) * 1000}
        if key == "wake":
            first, second = self.pooled.wake_exec("sleeper")
            return {"wake": first, "wake_second": second}
        if key == "memory":
            awake = self.pooled.awake_agent_kib(self.many[:10])
            parts = self.pooled.idle_memory_kib(self.many[:10], settle=HIBERNATE_SECONDS + 2.0)
            return {
                key: (parts["sandbox"] + parts["slirp"]) / 1024,
                **{f"{kind}_pss": kib / 1024 for kind, kib in parts.items()},
                "sandbox_pss_awake": awake / 1024,
            }
        raise KeyError(key)


class DockerSide:
    """Docker's rows on one runtime, where it has one (no pool, no hibernation:
    those rows stay empty)."""

    def __init__(self, docker: Docker, source: Path) -> None:
        self.docker, self.source = docker, source
        try:
            self.hot = docker.create_started()
            for _ in range(30):
                docker.exec(self.hot, ["true"])
            docker.put_archive(self.hot, source, "warm.bin")  # first-write costs; read rows
            self.scratch = Path(tempfile.mkdtemp(prefix="podbay-compare-docker-read-"))
            self.many = [docker.create_started() for _ in range(20)]
        except BaseException:
            docker.close()
            raise

    def close(self) -> None:
        self.docker.close()
        shutil.rmtree(self.scratch, ignore_errors=True)

    def sample(self, key: str) -> dict[str, float]:
        d = self.docker
        if key == "new_pool":
            return {key: d.new_to_first_output()}
        if key == "new_cold":
            return {key: d.new_to_first_output(), "docker run --rm, ms": 1000 * d.run_echo()}
        if key == "exec_hot":
            return {key: timed(lambda: d.exec(self.hot, ["true"]))}
        if key == "suspend":
            return {
                "suspend": timed(lambda: ok(d.api.post(f"/containers/{self.hot}/pause"))),
                "resume": timed(lambda: ok(d.api.post(f"/containers/{self.hot}/unpause"))),
            }
        if key == "write_sdk":
            return {key: d.timed_cli("cp", str(self.source), f"{self.hot}:/workspace/bench.bin")}
        if key == "write_agent":
            return {key: d.put_archive(self.hot, self.source, "direct.bin")}
        if key == "read_sdk":
            target = self.scratch / "read.bin"
            took = d.timed_cli("cp", f"{self.hot}:{WARM}", str(target))
            target.unlink()
            return {key: took}
        if key == "read_agent":
            return {key: d.get_archive(self.hot, WARM)}
        if key == "cli":
            return {key: d.timed_cli("exec", self.hot, "true")}
        if key == "throughput":
            return {key: d.throughput(self.many, 8, 5.0)}
        if key == "memory":
            return {key: d.idle_memory_kib(self.many[:10], settle=2.0) / 1024}
        return {}


class WorkerSide:
    """podbay's rows from another checkout, in a child process (``--worker``)."""

    def __init__(
        self, src: str, cli: str, source: Path, digest: str, size: int, klass: str
    ) -> None:
        env = {**os.environ, "PYTHONPATH": src}
        self.proc = subprocess.Popen(
            [
                sys.executable,
                os.path.abspath(__file__),
                "--worker",
                "--cli",
                cli,
                "--source",
                str(source),
                "--digest",
                digest,
                "--size",
                str(size),
                "--class",
                klass,
            ],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        ready = self.proc.stdout.readline()
        if not ready.startswith("ready"):
            raise RuntimeError(f"the worker for {src} did not start: {ready!r}")

    def sample(self, key: str) -> dict[str, float]:
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        self.proc.stdin.write(key + "\n")
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline()
        if not answer:
            raise RuntimeError(f"the worker ended (exit {self.proc.wait(30)}) at {key}")
        return dict(json.loads(answer))

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(300)


def worker(args: argparse.Namespace) -> int:
    """Serve sample requests (one row key per line) for a parent's interleaved run."""
    # The parent's requests come on a descriptor of the worker's own: nothing
    # it starts (servers, their sandboxes) inherits the request pipe as stdin.
    requests = os.fdopen(os.dup(0), "r")
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    side = PodbaySide(Path(args.source), args.digest, args.size, args.klass)
    try:
        print("ready", flush=True)
        for line in requests:
            print(json.dumps(side.sample(line.strip())), flush=True)
    finally:
        side.close()
    return 0


def floors(source: Path, runs: int, mib: int) -> list[Row]:
    out = [Row("spawn /bin/true (posix_spawn + wait)", "ms").run(floor_spawn, None, runs * 10)]
    with loopback_server() as port:
        conn = http.client.HTTPConnection("127.0.0.1", port)

        def round_trip() -> float:
            started = time.perf_counter()
            conn.request("POST", "/", body=b'{"command":["true"]}')
            conn.getresponse().read()
            return time.perf_counter() - started

        for _ in range(50):
            round_trip()
        out.append(Row("loopback HTTP round trip", "ms").run(round_trip, None, runs * 10))
        conn.close()
    target = source.with_name("copy.bin")

    def host_cp() -> float:
        with contextlib.suppress(FileNotFoundError):
            target.unlink()
        return timed(lambda: subprocess.run(["cp", str(source), str(target)], check=True))

    host_cp()
    out.append(
        Row(f"host cp of the same {mib} MiB file", "ms").run(host_cp, None, max(3, runs // 3))
    )
    out.append(Row("python -I -S -c pass", "ms").run(python_start(["-I", "-S"]), None, runs))
    out.append(Row("python -c pass", "ms").run(python_start([]), None, runs))
    return out


def run(args: argparse.Namespace) -> tuple[list[Row], list[Row], dict[str, Any]]:
    extra: dict[str, Any] = {}
    scratch = Path(tempfile.mkdtemp(prefix="podbay-compare-files-"))
    source, digest, size = make_source(scratch, args.mib)
    sides: list[Any] = []
    labels = [f"podbay (this checkout), class {args.klass}"]
    runtimes = (
        args.docker_runtimes if args.docker_runtimes is not None else DOCKER_RUNTIME[args.klass]
    )
    try:
        sides.append(PodbaySide(source, digest, size, args.klass))
        if args.against:
            against_class = args.against_class or args.klass
            sides.append(
                WorkerSide(args.against, args.against_cli, source, digest, size, against_class)
            )
            labels.append(f"podbay from {args.against}, class {against_class}")
        if not args.no_docker and runtimes:
            known = Docker.runtimes(args.docker_image)
            for runtime in runtimes.split(",") if known else []:
                if runtime not in known:
                    print(f"docker: no runtime {runtime} (has {', '.join(known)})", file=sys.stderr)
                    continue
                docker = Docker(args.docker_image, runtime, args.docker_cli)
                labels.append(
                    f"Docker {docker.version()} {runtime}"
                    f"{' ' + RUNSC_NOTE if runtime == 'runsc' else ''}, no network"
                )
                sides.append(DockerSide(docker, source))
        if len(sides) == 1:
            labels.append("none (no Docker running, or --no-docker): podbay's rows and the floors")
        extra["columns"] = dict(zip(COLUMNS.upper(), labels, strict=False))
        rows = {
            key: Row(label.format(mib=args.mib), unit, scale, better)
            for key, label, unit, scale, _, better in ROWS
        }
        more: dict[str, list[float]] = {}
        wanted = set(args.rows.split(",")) if args.rows else None
        for key, _, _, _, share, _ in ROWS:
            if share == 0 or (wanted is not None and key not in wanted):
                continue  # filled by another row's samples, or not asked for
            for _ in range(max(1, round(args.runs * share))):
                # Column by column, sample for sample: A B C A B C ...
                for i, side in enumerate(sides):
                    for name, value in side.sample(key).items():
                        row = rows.get(name)
                        if row is None:
                            tag = "" if i == 0 else f" ({COLUMNS[i].upper()})"
                            more.setdefault(name + tag, []).append(value)
                        else:
                            row.column(i).append(value * row.scale)
        extra.update({k: round(median(v), 2) for k, v in more.items()})
    finally:
        for side in sides:
            side.close()
        if sys.exc_info()[0] is not None:  # stopped early: floors are not wanted
            shutil.rmtree(scratch, ignore_errors=True)
    try:
        machine = floors(source, args.runs, args.mib)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return list(rows.values()), machine, extra


#: Docker's runtime that matches each class: the same OCI runtime (runc, or
#: gVisor's runsc) under Docker; a vm has none (Docker runs no VMs here).
DOCKER_RUNTIME = {"container": "runc", "gvisor": "runsc", "vm": ""}

#: How runsc runs under bench/docker_setup.py's daemon.
RUNSC_NOTE = "(ptrace platform)"


def _stop_on_sigterm(signum: int, frame: Any) -> None:
    print(f"compare.py (pid {os.getpid()}): SIGTERM, stopping", file=sys.stderr)
    sys.exit(143)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--class",
        dest="klass",
        choices=sorted(DOCKER_RUNTIME),
        default="gvisor",
        help="podbay's sandbox class to measure (default: gvisor, the default class), "
        "against Docker on the matching runtime (container: runc, gvisor: runsc, vm: none)",
    )
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--mib", type=int, default=100)
    parser.add_argument(
        "--docker-image",
        default=IMAGE,
        help="a local image with sleep and echo (default: podbay's base image, "
        "as bench/docker_setup.py imports it)",
    )
    parser.add_argument(
        "--docker-runtimes",
        default=None,
        metavar="NAME,NAME",
        help="Docker's runtimes to measure, one column each (default: the class's: "
        "runc for container, runsc for gvisor, none for vm)",
    )
    parser.add_argument(
        "--docker-cli",
        default=DOCKER_CLI if os.path.exists(DOCKER_CLI) else "docker",
        help="the docker CLI for the CLI rows (default: the daemon's own release's)",
    )
    parser.add_argument("--no-docker", action="store_true")
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--cli",
        default=None,
        metavar="COMMAND",
        help="how to run podbay's CLI (default: the podbay script beside "
        "this interpreter), e.g. 'python -m podbay.cli.main'",
    )
    parser.add_argument(
        "--against",
        metavar="SRC",
        help="interleave with podbay from another checkout's src directory "
        "(column B) instead of Docker",
    )
    parser.add_argument(
        "--against-cli",
        default=f"{sys.executable} -m podbay.cli.main",
        metavar="COMMAND",
        help="how to run that checkout's CLI",
    )
    parser.add_argument(
        "--against-class",
        choices=sorted(DOCKER_RUNTIME),
        default=None,
        help="the class of --against's server (default: --class), e.g. "
        "`--against src --against-class container` sets gvisor beside container",
    )
    parser.add_argument(
        "--rows", metavar="KEY,KEY", help="only these rows: " + ", ".join(k for k, *_ in ROWS)
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--source", help=argparse.SUPPRESS)
    parser.add_argument("--digest", help=argparse.SUPPRESS)
    parser.add_argument("--size", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    # Stopped early (Ctrl-C, kill, or SIGINT to a run started in the background,
    # where it is ignored), it still removes its servers' sandboxes and Docker's
    # containers: both end in the ``finally`` of ``run``.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    if args.cli:
        PODBAY[:] = args.cli.split()
    if args.worker:
        return worker(args)
    rows, machine, extra = run(args)
    if args.json:
        print(
            json.dumps(
                {
                    "rows": [r.as_dict() for r in rows],
                    "floors": [r.as_dict() for r in machine],
                    **extra,
                },
                indent=2,
            )
        )
        return 0
    columns: dict[str, str] = extra.pop("columns")
    for letter, label in columns.items():
        print(f"{letter}: {label}")
    # The columns that have figures (B says "none" when nothing ran beside A).
    others = [c.lower() for c in columns][1:]
    others = [c for c in others if any(c in r.as_dict() for r in rows)]
    head = "".join(f" {c.upper():>10}" for c in others)
    ratios = "".join(f" {'A/' + c.upper():>7}" for c in others)
    print(f"{'row':52} {'A':>10}{head}{ratios}  unit")
    for row in rows:
        if not row.podbay:
            continue
        d = row.as_dict()
        cells = "".join(f" {d[c]:10.2f}" if c in d else f" {'-':>10}" for c in others)
        cells += "".join(f" {d['a/' + c]:7.2f}" if c in d else f" {'':>7}" for c in others)
        print(f"{row.name:52} {d['a']:10.2f}{cells}  {row.unit}")
    if extra:
        print("  (" + ", ".join(f"{k} {v}" for k, v in extra.items()) + ")")
    print("floors of this machine:")
    for row in machine:
        print(f"  {row.name:50} {row.as_dict()['a']:10.2f} {'':>18}  {row.unit}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
