"""Where slirp4netns's DNS forwarder asks, for a sandbox with a network stack
of its own (gVisor's netstack) (pure: no I/O).

Such a sandbox writes its lookups to ``tap0`` itself, so they never meet the
resolver podbay puts on the namespace's ``lo``: they reach slirp4netns's
forwarder at 10.0.2.3, which sends them on to the first ``nameserver`` of the
``/etc/resolv.conf`` *it* sees. That slirp4netns is started in a mount
namespace of its own where a file naming a per-sandbox address on the host's
loopback is bind-mounted over ``/etc/resolv.conf``; podbay's resolver for that
sandbox listens there (port 53, UDP and TCP, in the host's namespace), so every lookup
the sandbox makes is answered, or refused, by podbay.

The file never changes while slirp4netns runs (libslirp re-reads it only when
its inode, size or mtime change, and a rewrite could be read half done, when
libslirp falls back to the host's 127.0.0.1): the address is chosen once, at
setup, and the resolver serves it whatever the policy, forwarding every name
under an open one.
"""

from __future__ import annotations

import hashlib
import ipaddress
from collections.abc import Iterable

__all__ = [
    "ADDRESSES",
    "RESOLV_FILE",
    "address_in",
    "candidates",
    "choose",
    "resolv_conf",
    "wildcard_port_53",
]

#: In the machine's directory: what slirp4netns sees as ``/etc/resolv.conf``.
RESOLV_FILE = "slirp.resolv.conf"
#: The host-loopback range the per-sandbox addresses come from: away from
#: 127.0.0.0/16 (127.0.0.1, systemd-resolved's 127.0.0.53 and .54, Debian's
#: 127.0.1.1), which the host's own services use.
ADDRESSES = ipaddress.IPv4Network("127.112.0.0/12")


def candidates(machine_id: str, count: int = 16) -> list[str]:
    """Addresses in :data:`ADDRESSES` to try for ``machine_id``, in order: the
    same every time (stable for one id), different for different ids, none
    ending in .0 or .255 (which some tools take for a network or broadcast)."""
    found: list[str] = []
    attempt = 0
    while len(found) < count:
        digest = hashlib.sha256(f"{machine_id}/{attempt}".encode()).digest()
        attempt += 1
        offset = int.from_bytes(digest[:4], "big") % ADDRESSES.num_addresses
        address = ADDRESSES.network_address + offset
        if address.packed[3] in (0, 255) or str(address) in found:
            continue
        found.append(str(address))
    return found


def choose(machine_id: str, taken: Iterable[str], count: int = 16) -> list[str]:
    """:func:`candidates` of ``machine_id`` that no other machine recorded."""
    held = set(taken)
    return [a for a in candidates(machine_id, count) if a not in held]


def resolv_conf(address: str) -> str:
    """The ``/etc/resolv.conf`` slirp4netns reads: ``address`` alone."""
    ipaddress.IPv4Address(address)  # never write anything else there
    return f"# podbay: this sandbox's lookups go to podbay's resolver\nnameserver {address}\n"


def address_in(text: str) -> str | None:
    """The address a file of :func:`resolv_conf` names (``None``: not one)."""
    for line in text.splitlines():
        fields = line.split()
        if len(fields) == 2 and fields[0] == "nameserver":
            try:
                address = ipaddress.IPv4Address(fields[1])
            except ValueError:
                return None
            return str(address) if address in ADDRESSES else None
    return None


def wildcard_port_53(proc_net: str, *, tcp: bool) -> bool:
    """Whether a ``/proc/net/udp`` (``tcp``: ``/proc/net/tcp``) table holds a
    socket bound to 0.0.0.0:53 (TCP: listening), which keeps every address of
    :data:`ADDRESSES` from podbay's resolvers (doctor says so)."""
    for line in proc_net.splitlines()[1:]:
        fields = line.split()
        bound = len(fields) > 3 and fields[1] == "00000000:0035"
        if bound and (not tcp or fields[3] == "0A"):  # 0A: TCP_LISTEN
            return True
    return False
