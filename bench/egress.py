"""How long an egress policy change takes to be in force, and a resolved name.

    .venv/bin/python bench/egress.py [-n 40]   (root: real namespaces)

* ``set_egress``: p50 / p95 of swapping a sandbox's policy into its running
  namespace's rules (record written, both tables replaced in one transaction):
  what ``PUT /api/v1/sandboxes/{name}/network`` waits for on its node.
* ``resolve``: p50 / p95 of one lookup of an allowed name through podbay's
  resolver (question checked, upstream asked, address added to the set before
  the answer), against a resolver of this script's on the host's loopback.

Throughput and connection setup through a policy against open egress, in
real sandboxes: ``bench/network.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import statistics
import struct
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from podbay.domain.egress import EgressPolicy
from podbay.runtime.network import NetworkManager, netns
from podbay.runtime.network.policy import SLIRP_DNS


def summary(samples: list[float]) -> dict[str, float]:
    samples.sort()
    return {
        "p50_ms": round(statistics.median(samples), 2),
        "p95_ms": round(samples[max(0, int(len(samples) * 0.95) - 1)], 2),
    }


class Upstream(asyncio.DatagramProtocol):
    """Answers every question with one A record (192.0.2.1, TTL 300)."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        head = struct.pack("!HHHHHH", struct.unpack("!H", data[:2])[0], 0x8180, 1, 1, 0, 0)
        record = b"\xc0\x0c" + struct.pack("!HHIH", 1, 1, 300, 4) + bytes([192, 0, 2, 1])
        self.transport.sendto(head + data[12:] + record, addr)  # type: ignore[attr-defined]


def query(name: str) -> bytes:
    labels = b"".join(bytes([len(p)]) + p.encode() for p in name.split("."))
    return struct.pack("!HHHHHH", 7, 0x0100, 1, 0, 0, 0) + labels + b"\0\0\1\0\1"


async def main(n: int) -> None:
    loop = asyncio.get_running_loop()
    upstream, _ = await loop.create_datagram_endpoint(Upstream, local_addr=("127.0.0.1", 0))
    port = upstream.get_extra_info("sockname")[1]
    with tempfile.TemporaryDirectory(prefix="podbay-bench-egress-") as directory:
        manager = NetworkManager(Path(directory), dns_upstream="127.0.0.1")
        path = (await manager.setup("bench")).netns_path
        try:
            changes = []
            for i in range(n):
                policy = EgressPolicy.parse({"allow": [f"198.51.100.{i % 250}"]})
                start = time.perf_counter()
                await manager.set_egress("bench", policy)
                changes.append((time.perf_counter() - start) * 1000)
            await manager.set_egress("bench", EgressPolicy.parse({"allow": ["bench.test"]}))
            manager._resolvers["bench"].upstream = ("127.0.0.1", port)

            def client() -> socket.socket:
                netns.enter(path)
                sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
                sock.connect((SLIRP_DNS, 53))
                sock.setblocking(False)
                return sock

            sock = await netns.in_fresh_thread(client)
            lookups = []
            for _ in range(n):
                start = time.perf_counter()
                await loop.sock_sendall(sock, query("bench.test"))
                await asyncio.wait_for(loop.sock_recv(sock, 512), 5)
                lookups.append((time.perf_counter() - start) * 1000)
            sock.close()
        finally:
            await manager.teardown("bench")
            upstream.close()
    print(json.dumps({"n": n, "set_egress": summary(changes), "resolve": summary(lookups)}))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("-n", type=int, default=40)
    asyncio.run(main(parser.parse_args().n))
