"""The multi-node harness's load balancer: a real haproxy in front of two small
HTTP servers standing in for control replicas. Its byte counters are what the
cluster test reads to show the control plane carried no data-plane bytes, so
they are checked here against a known upload."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from podbay.testing.local_cluster import LoadBalancer
from podbay.testing.platform import free_port


class Replica(BaseHTTPRequestHandler):
    """Answers /healthz, names itself, and swallows uploads."""

    def do_GET(self) -> None:
        self.answer(self.server.server_address[1])

    def do_PUT(self) -> None:
        length = int(self.headers["Content-Length"])
        while length:
            length -= len(self.rfile.read(min(length, 1 << 16)))
        self.answer(self.server.server_address[1])

    def answer(self, port: object) -> None:
        body = str(port).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def replicas() -> Iterator[dict[str, ThreadingHTTPServer]]:
    servers = {}
    for name in ("control-0", "control-1"):
        server = ThreadingHTTPServer(("127.0.0.1", free_port()), Replica)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers[name] = server
    yield servers
    for server in servers.values():
        server.shutdown()
        server.server_close()


@pytest.fixture
def balancer(tmp_path: Path, replicas: dict[str, ThreadingHTTPServer]) -> Iterator[LoadBalancer]:
    ports = {name: s.server_address[1] for name, s in replicas.items()}
    lb = LoadBalancer(tmp_path / "lb", free_port(), ports)
    lb.start()
    try:
        for name in ports:
            lb.wait_status(name, "UP")
        yield lb
    finally:
        lb.stop()


def test_requests_go_round_robin_to_both_replicas(balancer, replicas):
    ports = {str(s.server_address[1]) for s in replicas.values()}
    with httpx.Client(base_url=balancer.url, timeout=10) as http:
        seen = {http.get("/api").text for _ in range(6)}
    assert seen == ports


def test_counters_carry_the_bytes_each_replica_received(balancer, replicas):
    before = balancer.counters()
    upload = b"x" * (4 << 20)
    with httpx.Client(base_url=balancer.url, timeout=30) as http:
        port = http.put("/upload", content=upload).text
    (name,) = [n for n, s in replicas.items() if str(s.server_address[1]) == port]
    (other,) = set(replicas) - {name}
    # haproxy adds a session's bytes to its counters when the session ends,
    # which may be just after the client has its answer and has closed.
    deadline = time.monotonic() + 10
    while (after := balancer.counters())[name].bytes_in - before[name].bytes_in < len(upload):
        assert time.monotonic() < deadline, after
        time.sleep(0.05)
    assert after[name].bytes_in - before[name].bytes_in >= len(upload)
    # The other replica saw health checks only (a few hundred bytes), no upload.
    assert after[other].bytes_in - before[other].bytes_in < 64 << 10


def test_a_dead_replica_leaves_the_pool_and_requests_still_succeed(balancer, replicas):
    replicas["control-1"].shutdown()
    replicas["control-1"].server_close()
    balancer.wait_status("control-1", "DOWN")
    alive = str(replicas["control-0"].server_address[1])
    with httpx.Client(base_url=balancer.url, timeout=10) as http:
        assert {http.get("/api").text for _ in range(4)} == {alive}


def test_a_broken_configuration_is_refused(tmp_path):
    lb = LoadBalancer(tmp_path / "lb", free_port(), {"bad name": 1})
    with pytest.raises(RuntimeError, match="haproxy refuses"):
        lb.check()
