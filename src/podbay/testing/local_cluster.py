"""A whole podbay cluster on one machine, for tests and benchmarks::

    from podbay.testing.local_cluster import LocalCluster

    with LocalCluster.start(tmp_path) as cluster:   # PostgreSQL, haproxy, 2 control, 3 nodes
        token = cluster.create_deployment("agent")
        client = SandboxClient(identity_token=token, server_url=cluster.url)
        cluster.attach(token, "t1", control=1)          # straight to one replica

The parts are the real ones: a temporary PostgreSQL
(:class:`~podbay.testing.postgres.TemporaryCluster`), ``podbay control``
replicas sharing its database, Debian's haproxy in front of them (agents and
nodes reach the control plane only through it, as in a deployment), and
``podbay node`` processes, each with its own data directory, run directory
and port, sharing the machine's base-image cache. :meth:`LocalCluster.close`
stops every process it started and destroys every machine of every node.
"""

from __future__ import annotations

import csv
import io
import json
import os
import secrets
import shutil
import socket
import subprocess
import time
import warnings
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from .fixtures import require_host
from .platform import SANDBOX_SPEC, PlatformServer, free_port, run_cli
from .postgres import TemporaryCluster

#: Settings that make a test cluster notice things in seconds, not minutes.
QUICK = {
    "PODBAY_CLUSTER_HEARTBEAT_SECONDS": "1",
    "PODBAY_CLUSTER_NODE_LOST_SECONDS": "10",
}


def haproxy_binary() -> str:
    found = shutil.which("haproxy") or shutil.which("haproxy", path="/usr/sbin:/sbin")
    if found is None:
        raise RuntimeError("haproxy not installed (Debian package haproxy)")
    return found


@dataclass(frozen=True)
class ServerCounters:
    """One haproxy backend server's counters (``show stat``)."""

    name: str
    status: str
    #: Bytes haproxy sent to this server (requests, uploads) and received from it.
    bytes_in: int
    bytes_out: int
    sessions: int


@dataclass
class LoadBalancer:
    """haproxy in HTTP mode, round robin over ``backends`` (``name -> port`` on
    127.0.0.1), health-checked on ``/healthz``, with a stats socket for its
    per-server byte counters."""

    root: Path
    port: int
    backends: Mapping[str, int]
    process: subprocess.Popen[bytes] | None = None
    #: How often haproxy checks each server (ms): a dead replica leaves the pool
    #: after two failed checks.
    check_interval_ms: int = 500

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def socket_path(self) -> Path:
        return self.root / "haproxy.sock"

    @property
    def config_path(self) -> Path:
        return self.root / "haproxy.cfg"

    def config(self) -> str:
        servers = "\n".join(
            f"    server {name} 127.0.0.1:{port} check" for name, port in self.backends.items()
        )
        # A request a dead replica refused, or dropped without an answer, is
        # sent again to another one. Attach and delete are idempotent by name;
        # a repeated stop, enrollment or heartbeat changes nothing more.
        return f"""global
    maxconn 4096
    stats socket {self.socket_path} mode 600 level admin

defaults
    mode http
    option redispatch
    retries 3
    retry-on conn-failure empty-response
    timeout connect 2s
    timeout client 120s
    timeout server 120s
    timeout http-request 15s

frontend podbay_control
    bind 127.0.0.1:{self.port}
    default_backend podbay_control

backend podbay_control
    balance roundrobin
    option httpchk GET /healthz
    http-check expect status 200
    default-server inter {self.check_interval_ms} fall 2 rise 1
{servers}
"""

    def check(self) -> None:
        """``haproxy -c`` on the configuration: it raises with haproxy's words."""
        self.root.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(self.config())
        result = subprocess.run(
            [haproxy_binary(), "-c", "-q", "-f", str(self.config_path)],
            capture_output=True,
            text=True,
            timeout=30,
        )
        if result.returncode != 0:
            raise RuntimeError(f"haproxy refuses its configuration: {result.stderr}")

    def start(self) -> None:
        self.check()
        log = open(self.root / "haproxy.log", "ab")  # noqa: SIM115 - owned by the child
        # -db: foreground, so the process is ours to stop.
        self.process = subprocess.Popen(
            [haproxy_binary(), "-db", "-f", str(self.config_path)],
            stdout=log,
            stderr=log,
            start_new_session=True,
        )
        log.close()
        deadline = time.monotonic() + 30
        while not self.socket_path.exists():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    "haproxy did not start: " + (self.root / "haproxy.log").read_text()[-2000:]
                )
            time.sleep(0.05)

    def command(self, line: str) -> str:
        """One command on the stats socket; its answer."""
        with socket.socket(socket.AF_UNIX) as sock:
            sock.settimeout(10)
            sock.connect(str(self.socket_path))
            sock.sendall(line.encode() + b"\n")
            chunks = []
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        return b"".join(chunks).decode()

    def counters(self) -> dict[str, ServerCounters]:
        """The backend's servers' counters, by server name."""
        text = self.command("show stat").lstrip("# ")
        found = {}
        for row in csv.DictReader(io.StringIO(text)):
            if row["pxname"] == "podbay_control" and row["svname"] in self.backends:
                found[row["svname"]] = ServerCounters(
                    name=row["svname"],
                    status=row["status"],
                    bytes_in=int(row["bin"] or 0),
                    bytes_out=int(row["bout"] or 0),
                    sessions=int(row["stot"] or 0),
                )
        return found

    def wait_status(self, name: str, status: str, timeout: float = 30.0) -> None:
        """Until haproxy's checks say ``name`` is ``status`` (``UP``, ``DOWN``)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.counters()[name].status.startswith(status):
                return
            time.sleep(0.1)
        raise TimeoutError(f"haproxy never saw {name} {status}: {self.counters()[name]}")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)


def process_io(pid: int) -> dict[str, int]:
    """``/proc/<pid>/io``: bytes a process read and wrote through any call
    (``rchar``, ``wchar``: sockets included)."""
    fields = {}
    for line in Path(f"/proc/{pid}/io").read_text().splitlines():
        key, _, value = line.partition(":")
        fields[key] = int(value)
    return fields


class PortCounters:
    """Bytes the kernel carried to and from local TCP ports, counted by an
    nftables table of this process's own on the host's input hook (loopback
    traffic passes it). Unlike ``/proc/<pid>/io`` it sees bytes a process moves
    with ``splice`` or ``sendfile``, as the gateway does with large bodies.

    ``with PortCounters({"node": 8701}) as counters: ...; counters.read()``
    """

    def __init__(self, ports: Mapping[str, int]) -> None:
        self.ports = dict(ports)
        self.table = f"podbay_ports_{os.getpid()}"

    def __enter__(self) -> PortCounters:
        rules = "\n".join(
            f"counter c_{port} {{}}\n"
            f"chain c_{port}_in {{ type filter hook input priority 0; policy accept; "
            f"tcp dport {port} counter name c_{port}; tcp sport {port} counter name c_{port}; }}"
            for port in self.ports.values()
        )
        self._nft(f"table inet {self.table} {{\n{rules}\n}}\n")
        return self

    def __exit__(self, *exc: object) -> None:
        self._nft(f"delete table inet {self.table}\n")

    def read(self) -> dict[str, int]:
        """Bytes (headers included) each named port has sent and received so far."""
        listing = subprocess.run(
            ["nft", "-j", "list", "counters", "table", "inet", self.table],
            check=True, capture_output=True, text=True,
        ).stdout  # fmt: skip
        counted = {
            entry["counter"]["name"]: entry["counter"]["bytes"]
            for entry in json.loads(listing)["nftables"]
            if "counter" in entry
        }
        return {name: counted[f"c_{port}"] for name, port in self.ports.items()}

    @staticmethod
    def _nft(script: str) -> None:
        subprocess.run(["nft", "-f", "-"], input=script, check=True, capture_output=True, text=True)


@dataclass
class LocalCluster:
    root: Path
    postgres: TemporaryCluster
    store_url: str
    enrollment_token: str
    balancer: LoadBalancer
    #: Settings every role gets (and the operator commands): ``QUICK`` and the caller's.
    env: dict[str, str] = field(default_factory=dict)
    controls: list[PlatformServer] = field(default_factory=list)
    nodes: list[PlatformServer] = field(default_factory=list)
    owns_postgres: bool = True

    @property
    def url(self) -> str:
        """The control plane as agents and nodes see it: the load balancer."""
        return self.balancer.url

    @property
    def control_url(self) -> str:
        return self.url

    @classmethod
    def start(
        cls,
        root: Path,
        *,
        controls: int = 2,
        nodes: int = 3,
        env: Mapping[str, str] | None = None,
        postgres: TemporaryCluster | None = None,
    ) -> LocalCluster:
        """Everything up and healthy: each control replica answers, haproxy
        sees them all, each node answers ``/healthz`` (so it is enrolled)."""
        require_host()
        root.mkdir(parents=True, exist_ok=True)
        db = postgres or TemporaryCluster.start()
        control_ports = {f"control-{i}": free_port() for i in range(controls)}
        cluster = cls(
            root=root,
            postgres=db,
            store_url=db.create_database(),
            enrollment_token=secrets.token_urlsafe(32),
            balancer=LoadBalancer(root / "haproxy", free_port(), control_ports),
            env={**QUICK, **(env or {})},
            owns_postgres=postgres is None,
        )
        try:
            cluster.balancer.start()
            for name, port in control_ports.items():
                cluster.controls.append(
                    PlatformServer.start(
                        root / name,
                        env=cluster.control_env(),
                        role="control",
                        port=port,
                        wait=False,
                    )
                )
            for control in cluster.controls:
                control.wait_ready()
            for name in control_ports:
                cluster.balancer.wait_status(name, "UP")
            for i in range(nodes):
                cluster.add_node(f"node-{i}", wait=False)
            for node in cluster.nodes:
                node.wait_ready()
        except BaseException:
            cluster.close()
            raise
        return cluster

    def control_env(self) -> dict[str, str]:
        return {
            **self.env,
            "PODBAY_STORE_URL": self.store_url,
            "PODBAY_CLUSTER_ENROLLMENT_TOKEN": self.enrollment_token,
            # Identity tokens name the load balancer, whichever replica issued them.
            "PODBAY_SERVER_PUBLIC_URL": self.url,
        }

    def add_node(
        self, name: str, env: Mapping[str, str] | None = None, *, wait: bool = True
    ) -> PlatformServer:
        """A node whose data directory is ``root/name``."""
        port = free_port()
        node = PlatformServer.start(
            self.root / name,
            env={
                **self.env,
                "PODBAY_NODE_CONTROL_URL": self.url,
                "PODBAY_NODE_NAME": name,
                "PODBAY_NODE_ADVERTISE_URL": f"http://127.0.0.1:{port}",
                "PODBAY_CLUSTER_ENROLLMENT_TOKEN": self.enrollment_token,
                **(env or {}),
            },
            role="node",
            port=port,
            wait=wait,
            data_dir=self.root / name,
        )
        self.nodes.append(node)
        return node

    # -- operator and client ------------------------------------------------------
    def cli(
        self, *args: str, input: str | None = None, check: bool = True, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        """An operator command (``deployment create``, ``node list`` ...) on the
        cluster's store, as an operator's machine runs it."""
        return run_cli(list(args), self.operator_env(), input, check, timeout)

    def operator_env(self) -> dict[str, str]:
        """The environment operator commands run with."""
        return {**os.environ, **self.control_env(), "PODBAY_DATA_DIR": str(self.root / "operator")}

    def create_deployment(self, name: str, spec: str = SANDBOX_SPEC) -> str:
        """Register ``name``; its identity token."""
        out = self.cli("deployment", "create", name, "--spec", "-", input=spec)
        return out.stdout.strip().splitlines()[-1]

    def attach(
        self, token: str, name: str, *, control: int | None = None, **kw: Any
    ) -> httpx.Response:
        """Attach through the load balancer, or straight to replica ``control``."""
        base = self.url if control is None else self.controls[control].url
        return httpx.put(
            f"{base}/api/v1/sandboxes/{name}",
            headers={"Authorization": f"Bearer {token}"},
            timeout=120,
            **kw,
        )

    def node_for(self, endpoint: str) -> PlatformServer:
        """The node a handle's ``endpoint`` points at."""
        (found,) = [n for n in self.nodes if endpoint.startswith(n.url + "/")]
        return found

    # -- the end ------------------------------------------------------------------
    def close(self) -> None:
        """Nodes first (their machines destroyed), then the control plane, the
        load balancer and the database. The nodes close side by side, then the
        replicas: each waits for its own process and cleans its own data
        directory, so one after the other only added up their waits."""
        for group in (self.nodes, self.controls):
            with ThreadPoolExecutor(max(1, len(group))) as pool:
                closing = [(server, pool.submit(server.close)) for server in group]
            for server, done in closing:
                exc = done.exception()
                if exc is not None:  # the rest still closed; the test run is told
                    warnings.warn(f"closing {server.name}: {exc!r}", RuntimeWarning, stacklevel=2)
        self.balancer.stop()
        if self.owns_postgres:
            self.postgres.stop()

    def __enter__(self) -> LocalCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
