"""A stand-in for the internet for the egress-policy bypass probes
(``podbay doctor``'s, and the tests'), with a witness of what reached it.

The decoy is a network namespace joined to the host by a veth pair, with two
addresses of a documentation range (RFC 5737's TEST-NETs, 198.51.100.0/24
first: never routed on the internet) and one of 2001:db8::/32, so a sandbox
reaches it as it reaches any internet address (through its slirp4netns and
the host's routing) and nothing leaves the machine. It serves what a bypass
would use: DNS-shaped answers on UDP 53, TCP on 53, 853 (DNS over TLS) and
443 (DNS over HTTPS), UDP echo on port 7; its kernel answers ICMP echo. The
witness, an nftables table in its namespace, counts every packet that arrives
by kind, so a bypass is judged by what reached the server, also when the
sandbox cannot see an answer (GRE, SCTP).
"""

from __future__ import annotations

import contextlib
import ipaddress
import itertools
import json
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

__all__ = ["COUNTED", "Decoy", "Witness", "decoy_host", "remove_stale"]

#: Where decoys go: the documentation ranges of RFC 5737 (TEST-NET-2, -3, -1),
#: whose /29s are taken from the top down (a host may sit in one: some do).
DECOY_RANGES = tuple(
    ipaddress.IPv4Network(n) for n in ("198.51.100.0/24", "203.0.113.0/24", "192.0.2.0/24")
)
WITNESS_TABLE = "podbay_witness"
#: The host's end of a decoy's veth pair is ``pbdc<pid>x<n>``; its directory
#: ``<tmp>/podbay-decoy-<pid>-…`` (the pid: what :func:`remove_stale` checks).
LINK_PREFIX = "pbdc"
WORKDIR_PREFIX = "podbay-decoy-"
PYTHON = shutil.which("python3", path="/usr/bin:/bin") or "/usr/bin/python3"
#: TCP ports the decoy serves (DNS over TCP, DNS over TLS, HTTPS as DoH).
TCP_PORTS = (53, 853, 443)

#: What the witness counts: its name → the packets (an nftables match).
#: ``udp_echo`` is how user-mode networking (libslirp, in slirp4netns and
#: QEMU) sends on a ping it may not send as ICMP (no ping socket for its group).
COUNTED: dict[str, tuple[str, ...]] = {
    "dns_udp": ("udp dport 53",),
    "dns_tcp": ("tcp dport 53",),
    "dot": ("th dport 853",),
    "icmp": ("ip protocol icmp",),
    "udp_echo": ("udp dport 7",),
    "other": ("ip protocol != { tcp, udp, icmp }",),
    # Neighbour discovery and the like (ICMPv6) come from the host itself.
    "ipv6": ("meta nfproto ipv6 meta l4proto { tcp, udp }",),
}

#: Run in the decoy's namespace: answers on UDP 53 (the query sent back as a
#: response) and UDP 7 (echo), a banner on each TCP port of argv[1:].
SERVER = r"""
import socket, sys, threading

def dual(kind):
    # One socket for IPv4 and IPv6.
    s = socket.socket(socket.AF_INET6, kind)
    s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    return s

def udp(port, answer):
    s = dual(socket.SOCK_DGRAM)
    s.bind(("::", port))
    while True:
        data, peer = s.recvfrom(4096)
        s.sendto(answer(data), peer)

def tcp(port):
    s = dual(socket.SOCK_STREAM)
    s.bind(("::", port)); s.listen(64)
    while True:
        c, _ = s.accept()
        try:
            c.sendall(b"decoy\n")
        finally:
            c.close()

dns = lambda q: q[:2] + bytes([0x81, 0x80]) + q[4:] if len(q) >= 12 else q
threads = [threading.Thread(target=udp, args=(53, dns))]
threads += [threading.Thread(target=udp, args=(7, bytes))]
threads += [threading.Thread(target=tcp, args=(int(p),)) for p in sys.argv[1:]]
for t in threads:
    t.daemon = True
    t.start()
print("ready", flush=True)
sys.stdin.read()
"""


def _run(*argv: str, input: str | None = None) -> str:
    done = subprocess.run(
        argv, capture_output=True, text=True, input=input, check=False, timeout=30
    )
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed: {done.stderr.strip()}")
    return done.stdout


@dataclass(frozen=True)
class Witness:
    """Counters of what arrived in ``netns`` (see :data:`COUNTED`), plus TCP
    to port 443 per address of ``addresses`` (``https_<i>``)."""

    netns: Path
    addresses: tuple[str, ...]

    def _nft(self, *args: str, input: str | None = None) -> str:
        return _run("nsenter", f"--net={self.netns}", "--", "nft", *args, input=input)

    def ruleset(self) -> str:
        counted = dict(COUNTED)
        for i, address in enumerate(self.addresses):
            counted[f"https_{i}"] = (f"ip daddr {address} tcp dport 443",)
        # Prefixed: a bare name such as "icmp" is a keyword to nft.
        counters = "".join(f"\tcounter seen_{name} {{ }}\n" for name in counted)
        rules = "".join(
            f'\t\t{match} counter name "seen_{name}"\n'
            for name, matches in counted.items()
            for match in matches
        )
        return (
            f"table inet {WITNESS_TABLE} {{\n{counters}\tchain prerouting {{\n"
            "\t\ttype filter hook prerouting priority raw; policy accept;\n"
            f'\t\tiifname "lo" accept\n{rules}\t}}\n}}\n'
        )

    def load(self) -> None:
        self._nft("-f", "-", input=self.ruleset())

    def counts(self) -> dict[str, int]:
        """Packets that arrived of each kind since the last :meth:`reset`."""
        listed = json.loads(self._nft("-j", "list", "counters", "table", "inet", WITNESS_TABLE))
        return {
            item["counter"]["name"].removeprefix("seen_"): int(item["counter"]["packets"])
            for item in listed["nftables"]
            if "counter" in item
        }

    def reset(self) -> None:
        self._nft("reset", "counters", "table", "inet", WITNESS_TABLE)

    def remove(self) -> None:
        with contextlib.suppress(RuntimeError):
            self._nft("delete", "table", "inet", WITNESS_TABLE)


@dataclass(frozen=True)
class Decoy:
    #: A policy allows this one: what it serves there must still be refused.
    allowed: str
    #: No policy allows this one (no allowed name gave it).
    refused: str
    #: An IPv6 address of the decoy, which the host reaches: no IPv6 leaves a
    #: sandbox, so nothing may arrive there from one.
    ipv6: str
    witness: Witness


#: Tells a process's decoys apart (one a test holds, one a doctor makes).
_serials = itertools.count()


def _taken() -> list[ipaddress.IPv4Network]:
    """IPv4 networks the host has addresses or routes in."""
    found = []
    for args in (("-4", "-j", "addr", "show"), ("-4", "-j", "route", "show", "table", "all")):
        for entry in json.loads(_run("ip", *args) or "[]"):
            infos = entry.get("addr_info") or [{"local": entry.get("dst", "")}]
            for info in infos:
                text = info.get("local", "")
                if text and text != "default" and text[0].isdigit():
                    found.append(ipaddress.IPv4Network(text, strict=False))
    return found


def free_subnet() -> ipaddress.IPv4Network:
    """The first /29 of :data:`DECOY_RANGES` the host neither has nor routes."""
    taken = _taken()
    for decoys in DECOY_RANGES:
        for subnet in reversed(list(decoys.subnets(new_prefix=29))):
            if not any(subnet.overlaps(net) for net in taken):
                return subnet
    raise RuntimeError("no free /29 of the documentation ranges for the egress probes' decoy")


@contextlib.contextmanager
def decoy_host() -> Iterator[Decoy]:
    """A decoy of its own (namespace, veth ``pbdc<pid>``, servers, witness),
    undone on exit, even half made."""
    remove_stale()
    subnet = free_subnet()
    allowed, refused = (str(a) for a in list(subnet.hosts())[1:3])
    workdir = Path(tempfile.mkdtemp(prefix=f"{WORKDIR_PREFIX}{os.getpid()}-"))
    netns = workdir / "netns"
    link = f"{LINK_PREFIX}{os.getpid()}x{next(_serials) % 10}"
    inside = ["nsenter", f"--net={netns}", "--", "ip"]
    server: subprocess.Popen[str] | None = None
    try:
        netns.touch()
        _run("unshare", f"--net={netns}", "true")
        _run("ip", "link", "add", link, "type", "veth", "peer", "name", f"{link}p")
        _run("ip", "link", "set", f"{link}p", "netns", str(netns))
        # No IPv4 address on the host's end, only a route: an address there
        # would be a new host address, which a running sandbox whose rules
        # are not refreshed on address changes (a vm's) could reach the host
        # by. The host talks to the decoy from an address it already has, and
        # the decoy answers through the link (the host answers its ARP).
        _run("ip", "link", "set", link, "up")
        _run("ip", "route", "add", str(subnet), "dev", link)
        _run(*inside, "link", "set", "lo", "up")
        for address in (allowed, refused):
            _run(*inside, "addr", "add", f"{address}/{subnet.prefixlen}", "dev", f"{link}p")
        _run(*inside, "link", "set", f"{link}p", "up")
        _run(*inside, "route", "add", "default", "dev", f"{link}p")
        # A /64 of 2001:db8::/32 (documentation) named after the IPv4 /29; the
        # host's end has an address in it (no IPv6 leaves a sandbox at all).
        v4 = int(subnet.network_address)
        prefix = f"2001:db8:{v4 >> 16:x}:{v4 & 0xFFFF:x}"
        ipv6 = f"{prefix}::2"
        _run("ip", "-6", "addr", "add", f"{prefix}::1/64", "dev", link, "nodad")
        _run(*inside, "-6", "addr", "add", f"{ipv6}/64", "dev", f"{link}p", "nodad")
        found = Witness(netns, (allowed, refused))
        found.load()
        server = subprocess.Popen(
            ["nsenter", f"--net={netns}", "--", PYTHON, "-I", "-c", SERVER,
             *(str(p) for p in TCP_PORTS)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )  # fmt: skip
        assert server.stdout is not None
        if server.stdout.readline() != "ready\n":
            raise RuntimeError("the egress probes' decoy server did not start")
        _wait_reachable(allowed)
        _wait_reachable(ipv6)
        yield Decoy(allowed, refused, ipv6, found)
    finally:
        if server is not None:
            server.kill()
            server.wait(timeout=10)
            for stream in (server.stdin, server.stdout):
                if stream is not None:
                    stream.close()
        _run_quietly("ip", "link", "del", link)
        if netns.exists():
            _run_quietly("umount", "-l", str(netns))
        shutil.rmtree(workdir, ignore_errors=True)


def remove_stale() -> None:
    """Undo what a decoy of a process that is gone (a killed doctor) left:
    its link, its namespace's mount, its directory."""
    for line in _run("ip", "-o", "link", "show").splitlines():
        name = line.split(":")[1].strip().split("@")[0]
        digits = name.removeprefix(LINK_PREFIX).split("x")[0]
        if name.startswith(LINK_PREFIX) and digits.isdigit() and not _alive(int(digits)):
            _run_quietly("ip", "link", "del", name)
    for entry in Path(tempfile.gettempdir()).glob(f"{WORKDIR_PREFIX}*-*"):
        digits = entry.name.removeprefix(WORKDIR_PREFIX).split("-")[0]
        if digits.isdigit() and not _alive(int(digits)):
            _run_quietly("umount", "-l", str(entry / "netns"))
            shutil.rmtree(entry, ignore_errors=True)


def _alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


def _run_quietly(*argv: str) -> None:
    subprocess.run(argv, capture_output=True, check=False, timeout=30)


def _wait_reachable(address: str) -> None:
    """The host reaches the decoy's TCP port (the positive control): up to 10 s."""
    import socket

    deadline = time.monotonic() + 10
    while True:
        with contextlib.suppress(OSError), socket.create_connection((address, 443), 0.5):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"the egress probes' decoy does not answer on {address}:443")
        time.sleep(0.05)
