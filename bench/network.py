"""Connection setup and throughput through an egress policy against open egress.

    .venv/bin/python bench/network.py [--class gvisor] [--rounds 31] [-n 50] [--mib 32]
                                      [--transfers 3] [--same] [--json]

Root only (real sandboxes, a network namespace, a veth pair); never part of
the test suite. One ``podbay serve`` (``podbay.testing.platform``) with the one
class ``--class``, and a test host (``podbay.testing.upstream``: a network
namespace joined to this host by a veth pair, with public-looking addresses)
standing in for the internet. It serves two things:

* on ``upstream``'s port, its banner server (accept, send, close): the
  target of the connection rows;
* on ``SINK_PORT``, a sink of this script: it reads a connection to its end,
  then answers with the byte count, so the client's clock stops only once
  every byte has arrived.

Two sandboxes side by side: in each round one has open egress (no policy)
and the other a policy (``PUT .../network`` before the round): an allow
list holding the test host's first address among other CIDRs and domain
names, and a deny list, so that a packet of theirs walks the platform's
refusals, the deny set, the resolved-names set and the allow set before it
leaves. The roles swap every round and the order every two rounds, so that
neither a difference between the two sandboxes nor a machine shared with
other work favours one side. Each round runs ``PROBE`` (a Python script in
the sandbox, through the SDK's exec) in both; it ends with the control: the
test host's second address (the same server, not allowed) must be reached
from the open side and not from the other, or the script stops. Measured:

* ``connect_ms``: the median over ``-n`` TCP connections, one after another,
  of ``time.perf_counter`` around ``connect`` (the handshake through the
  sandbox's stack, slirp4netns and the host's routing); no name is looked up.
  Under a policy with names a connection's handshake ends at the name check
  in the sandbox's namespace, which connects onward meanwhile, so this no
  longer shows the whole cost; the next two do:
* ``banner_ms``: the same, from ``connect`` to the server's first bytes (the
  banner server speaks first: through the check, its connection onward);
* ``request_ms``: the same, sending an HTTP request head first (through the
  check: read, its ``Host`` judged, then passed on);
* ``mib_s``: ``--mib`` MiB sent over one connection to the sink, until its
  answer; the median of ``--transfers`` such connections, one after another
  (one transfer's rate swings by 2x on a loaded machine).

Printed: per side, the median of the rounds; ``connect_added_ms``,
``banner_added_ms``, ``request_added_ms``: the median of the rounds'
``policy - open``; ``connect_ratio``, the median of the
rounds' ``policy / open``; ``throughput_slowdown``, the median of the
rounds' ``open / policy`` throughput (1.1 means the policy's transfer takes
10 % longer); each of the three with the quartiles of the rounds (``_q1``,
``_q3``), the spread a shared machine gives them; the rounds themselves
(``samples``); ``failures``, probes that failed (their round was run again).
One warm-up round first, not counted. ``--same`` leaves the "policy" side
open too: an A/A run, whose ratios show what this machine's noise alone
gives.
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from podbay import SandboxClient
from podbay.client import NetworkPolicy
from podbay.host.storage import remove_tree
from podbay.testing.platform import PlatformServer
from podbay.testing.upstream import PYTHON, Upstream, remove_stale_links, upstream

#: Links of this script's test hosts: ``pbnb<pid>h``.
LINK_PREFIX = "pbnb"
SINK_PORT = 8081

SINK = r"""
import socket, sys, threading
def serve(c):
    n = 0
    while True:
        data = c.recv(1 << 20)
        if not data:
            break
        n += len(data)
    c.sendall(str(n).encode()); c.close()
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", int(sys.argv[1]))); s.listen(16)
while True:
    c, _ = s.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
"""

#: Run in the sandbox: argv[1] is a JSON list [address, port, n, sink port, MiB,
#: transfers, control address]. The control address is tried last (1 s: gVisor's
#: refusals are drops, which time out).
PROBE = r"""
import json, socket, statistics, sys, time
address, port, n, sink_port, mib, transfers, control = json.loads(sys.argv[1])
times = []
for _ in range(n):
    s = socket.socket()
    start = time.perf_counter()
    s.connect((address, port))
    times.append(time.perf_counter() - start)
    s.close()
def first_byte(request):
    s = socket.socket()
    start = time.perf_counter()
    s.connect((address, port))
    if request:
        s.sendall(request)
    data = s.recv(64)
    took = time.perf_counter() - start
    s.close()
    assert data, "no banner"
    return took
banners = [first_byte(b"") for _ in range(n)]
asked = [first_byte(b"GET / HTTP/1.1\r\nHost: bench.test\r\n\r\n") for _ in range(n)]
chunk = b"x" * (1 << 20)
rates = []
for _ in range(transfers):
    s = socket.create_connection((address, sink_port))
    start = time.perf_counter()
    for _ in range(mib):
        s.sendall(chunk)
    s.shutdown(socket.SHUT_WR)
    got = b""
    while True:
        data = s.recv(64)
        if not data:
            break
        got += data
    rates.append(mib / (time.perf_counter() - start))
    s.close()
    assert int(got) == mib << 20, got
try:
    socket.create_connection((control, port), 1).close()
    reached = True
except OSError:
    reached = False
connect_ms = statistics.median(times) * 1000
print(json.dumps({
    "connect_ms": connect_ms,
    "banner_ms": statistics.median(banners) * 1000,
    "request_ms": statistics.median(asked) * 1000,
    "mib_s": statistics.median(rates),
    "control": reached,
}))
"""


def free_subnet() -> str:
    """A /29 of 198.51.100.64/27 that no interface of this host is on yet. Not
    192.0.2.0/24, where the E2B suite's test hosts are: on some machines that
    is the host's own network. The network suite puts 198.51.100.7 and .99 on
    the host, and .200 to .249: none of them in this /27."""
    taken = subprocess.run(["ip", "-o", "-4", "addr"], capture_output=True, text=True).stdout
    addresses = [ipaddress.IPv4Interface(f) for f in taken.split() if f.count(".") == 3]
    for k in range(4):
        subnet = ipaddress.IPv4Network(f"198.51.100.{64 + 8 * k}/29")
        if not any(a.ip in subnet or subnet.subnet_of(a.network) for a in addresses):
            return str(subnet)
    raise RuntimeError("no free /29 in 198.51.100.64/27")


@contextlib.contextmanager
def test_host(workdir: Path) -> Iterator[Upstream]:
    remove_stale_links(LINK_PREFIX)
    with upstream(workdir, f"{LINK_PREFIX}{os.getpid()}h", free_subnet()) as host:
        sink = subprocess.Popen(
            ["nsenter", f"--net={host.netns}", "--", PYTHON, "-I", "-c", SINK, str(SINK_PORT)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            deadline = time.monotonic() + 10
            while (
                f":{SINK_PORT} "
                not in subprocess.run(
                    ["nsenter", f"--net={host.netns}", "--", "ss", "-lnt"],
                    capture_output=True,
                    text=True,
                ).stdout
            ):
                if time.monotonic() > deadline:
                    raise RuntimeError("the sink did not start")
                time.sleep(0.05)
            yield host
        finally:
            sink.kill()
            sink.wait(10)


def policy_for(host: Upstream) -> NetworkPolicy:
    """Allows the test host's first address among others, and names; denies others."""
    allow = [f"100.{k}.0.0/16" for k in range(0, 64, 4)]  # public-looking, never reached
    allow += [f"8.{k}.0.0/16" for k in range(16)]
    allow += [f"{host.address}/32", "pypi.org", "*.pythonhosted.org"]
    deny = [f"9.{k}.0.0/16" for k in range(16)] + ["203.0.113.0/24"]
    return NetworkPolicy(allow=allow, deny=deny)


#: Per connection: ``connect`` alone, and until the first byte arrives, with
#: the server speaking first (a banner) or answering the client's request.
FIRST_BYTE_KEYS = ("connect_ms", "banner_ms", "request_ms")


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


class ProbeFailed(RuntimeError):
    pass


def spread(key: str, values: list[float]) -> dict[str, float]:
    """``key``: the median of ``values``; ``key_q1``, ``key_q3``: its quartiles."""
    if len(values) < 2:
        values = values * 2
    q1, q2, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return {key: round(q2, 3), f"{key}_q1": round(q1, 3), f"{key}_q3": round(q3, 3)}


def probe(client: SandboxClient, name: str, argv: list[Any]) -> dict[str, float]:
    done = client.exec(name, ["python3", "-c", PROBE, json.dumps(argv)], timeout_ms=300_000)
    if done.exit_code != 0:
        raise ProbeFailed(f"{name}: {done.stderr.strip().splitlines()[-1:]}")
    result: dict[str, float] = json.loads(done.stdout)
    return result


def measure(
    args: argparse.Namespace, root: Path
) -> tuple[dict[str, list[dict[str, float]]], list[str]]:
    """The rounds: each side's probe results, and the probes that failed."""
    env = {
        "PODBAY_RUNTIME_CLASSES": args.klass,
        "PODBAY_CAPS_PER_DEPLOYMENT": "10",
        "PODBAY_LOG_LEVEL": "warning",
    }
    with test_host(root) as host, PlatformServer.start(root / "serve", env=env) as server:
        deadline = time.monotonic() + 900
        while args.klass not in server.http.get("/healthz").json()["classes"]["available"]:
            if time.monotonic() > deadline:
                raise RuntimeError(f"class {args.klass} not available: {server.log_tail()}")
            time.sleep(0.5)
        token = server.create_deployment("bench-network")
        with SandboxClient(identity_token=token, server_url=server.base_url) as client:
            policy = policy_for(host)
            names = [f"{side}-{uuid.uuid4().hex[:6]}" for side in "ab"]
            for name in names:
                client.attach(name, args.klass)
            argv = [host.address, host.port, args.n, SINK_PORT, args.mib, args.transfers]
            argv.append(host.addresses[1])
            samples: dict[str, list[dict[str, float]]] = {"open": [], "policy": []}
            failures: list[str] = []
            try:
                for r in range(args.rounds + 1):
                    # Roles swap every round, and which runs first every two: a
                    # difference of the sandboxes themselves (their CPUs, their
                    # slirp4netns) falls on both sides alike.
                    roles = {"policy": names[r % 2], "open": names[1 - r % 2]}
                    if args.same:
                        client.set_network(roles["policy"])
                    else:
                        client.set_network(roles["policy"], allow=policy.allow, deny=policy.deny)
                    client.set_network(roles["open"])
                    order = ["open", "policy"] if (r // 2) % 2 == 0 else ["policy", "open"]
                    try:
                        got = {side: probe(client, roles[side], argv) for side in order}
                    except ProbeFailed as e:
                        # A connection reset now and then on a machine whose
                        # other users add and drop addresses and links: the
                        # round is run again, and the failure reported.
                        failures.append(f"round {r}: {e}")
                        if len(failures) > 3:
                            raise
                        got = {side: probe(client, roles[side], argv) for side in order}
                    # The control: the test host's other address is reached
                    # from the open side only, or the round measured nothing.
                    expected = [True, args.same]
                    if [got[side].pop("control") for side in ("open", "policy")] != expected:
                        raise RuntimeError(f"round {r}: the policy is not what was set")
                    if r == 0:
                        continue  # warm-up: first connections, first allocations
                    for side in order:
                        samples[side].append(got[side])
                    if not args.json:
                        print(f"round {r}: {json.dumps(got)}", file=sys.stderr)
            finally:
                for name in names:
                    with contextlib.suppress(Exception):
                        client.delete(name)
    return samples, failures


def main(args: argparse.Namespace) -> dict[str, Any]:
    if os.geteuid() != 0:
        sys.exit("bench/network.py needs root (real sandboxes, a network namespace)")
    root = Path(tempfile.mkdtemp(prefix="podbay-bench-network-"))
    try:
        samples, failures = measure(args, root)
    finally:
        # Its data and log; never while anything is still mounted there
        # (remove_tree refuses), e.g. after a server that did not stop.
        with contextlib.suppress(Exception):
            remove_tree(root)

    def column(side: str, key: str) -> list[float]:
        return [s[key] for s in samples[side]]

    pairs = list(zip(samples["open"], samples["policy"], strict=True))
    return {
        "class": args.klass,
        "rounds": args.rounds,
        "n": args.n,
        "mib": args.mib,
        "transfers": args.transfers,
        "same": args.same,
        **{
            side: {
                **{key: round(median(column(side, key)), 3) for key in FIRST_BYTE_KEYS},
                "mib_s": round(median(column(side, "mib_s")), 1),
            }
            for side in ("open", "policy")
        },
        **spread("connect_added_ms", [p["connect_ms"] - o["connect_ms"] for o, p in pairs]),
        **spread("banner_added_ms", [p["banner_ms"] - o["banner_ms"] for o, p in pairs]),
        **spread("request_added_ms", [p["request_ms"] - o["request_ms"] for o, p in pairs]),
        **spread("connect_ratio", [p["connect_ms"] / o["connect_ms"] for o, p in pairs]),
        **spread("throughput_slowdown", [o["mib_s"] / p["mib_s"] for o, p in pairs]),
        "failures": failures,
        "samples": samples,
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--class", dest="klass", default="gvisor", choices=["gvisor", "container", "vm"]
    )
    parser.add_argument("--rounds", type=int, default=31, help="counted rounds (after one warm-up)")
    parser.add_argument("-n", type=int, default=50, help="connections per round and sandbox")
    parser.add_argument("--mib", type=int, default=32, help="MiB sent per transfer")
    parser.add_argument("--transfers", type=int, default=3, help="transfers per round and sandbox")
    parser.add_argument(
        "--same",
        action="store_true",
        help="both sides open: the spread of the method itself (an A/A run)",
    )
    parser.add_argument("--json", action="store_true", help="print only the JSON result")
    options = parser.parse_args()
    result = main(options)
    print(json.dumps(result) if options.json else json.dumps(result, indent=2))
