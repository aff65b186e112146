"""The egress audit: which destinations a sandbox reached or was refused (pure: no I/O).

Two tables of their own in the sandbox's namespace, ``inet podbay_audit`` (the
namespace's kernel stack: runc, QEMU's user networking) and ``netdev
podbay_audit_tap`` (frames gVisor's netstack writes to ``tap0``), each with two
base chains around the policy's and the budget's:

- ``attempted`` (priority ``filter - 175``, before the policy) adds every IPv4
  packet off ``lo`` to ``attempted_v4``, keyed by destination address,
  protocol and port (0 for a protocol without ports), with a counter;
- ``reached`` (``filter + 20``, after the policy and the budget) adds what
  they let through to ``reached_v4``.

What was refused is the difference: a refusal (the platform's ranges, the
policy's deny, default-deny, another resolver, a budget) ends the packet
between the two chains. The reason is not recorded, only the verdict.

These tables are never swapped with the policy's (a ``PUT`` or a refresh
replaces ``podbay`` and ``podbay_tap`` only), so the audit outlives policy
changes. Elements expire :data:`TIMEOUT` seconds after their last packet
(``update`` refreshes it) and a set holds :data:`SIZE` of them: when it is
full, new destinations go unrecorded until old ones expire (a rule whose set
is full stops matching; the audit rules carry no verdict, so enforcement is
untouched). The kernel stack's packets are marked in ``attempted`` and skipped
at ``tap0``, so nothing counts twice.

Names come only from podbay's resolver (:class:`NameBook`), never from what a
sandbox sends unchecked.
"""

from __future__ import annotations

import json
import re
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ...domain.egress import AUDIT_SECONDS, AUDIT_SIZE
from ...domain.egress import EgressDestination as Destination
from .policy import CHECK_MARK, KERNEL_MARK, TAP_NAME

__all__ = [
    "NAMES",
    "SIZE",
    "TABLE",
    "TAP_TABLE",
    "TIMEOUT",
    "Counted",
    "Destination",
    "NameBook",
    "audit_ruleset",
    "destinations",
    "parse_sets",
]

TABLE = "podbay_audit"
TAP_TABLE = "podbay_audit_tap"
#: Seconds a destination stays in the audit after its last packet.
TIMEOUT = AUDIT_SECONDS
#: Destinations (address, protocol, port) a set holds at most per hook.
SIZE = AUDIT_SIZE
#: Addresses the resolver's answers are remembered for, per sandbox.
NAMES = 4096

Key = tuple[str, str, int]


def _set(name: str) -> str:
    return (
        f"\tset {name} {{ type ipv4_addr . inet_proto . inet_service; "
        f"flags dynamic,timeout; timeout {TIMEOUT}s; size {SIZE}; counter; }}\n"
    )


def _updates(ipv4: str, target: str, *, tracked: bool) -> str:
    # ICMP and others have no ports: "th dport" would read their checksum, so
    # each datagram would be a destination of its own. ``tracked``: keyed by
    # the connection's original destination (conntrack's), which a connection
    # the name check's redirect took to 127.0.0.1 still carries.
    address, port = (
        ("ct original ip daddr", "ct original proto-dst")
        if tracked
        else (
            "ip daddr",
            "th dport",
        )
    )
    return (
        f"\t\t{ipv4} meta l4proto {{ tcp, udp }} update @{target} "
        f"{{ {address} . meta l4proto . {port} }}\n"
        f"\t\t{ipv4} meta l4proto != {{ tcp, udp }} update @{target} "
        f"{{ {address} . meta l4proto . 0 }}\n"
    )


def _table(family: str, name: str, hook: str, skips: dict[str, str], ipv4: str, mark: str) -> str:
    # Before the policy's chain (which runs at "filter - 150" under a policy
    # naming domains, ahead of the name check's nat redirect) and after the
    # budget's.
    chains = {"attempted": "filter - 175", "reached": "filter + 20"}
    # Declared (idempotent), emptied, filled: loaded again (adoption) it keeps
    # its sets' elements and counters, and its rules once.
    head = f"table {family} {name} {{\n{_set('attempted_v4')}{_set('reached_v4')}"
    head += "".join(
        f"\tchain {chain} {{ type filter hook {hook} priority {priority}; policy accept; }}\n"
        for chain, priority in chains.items()
    )
    head += "}\n"
    head += "".join(f"flush chain {family} {name} {chain}\n" for chain in chains)
    body = f"table {family} {name} {{\n"
    for chain in chains:
        body += f"\tchain {chain} {{\n{skips[chain]}"
        if chain == "attempted" and mark:
            body += f"\t\t{mark}\n"
        body += _updates(ipv4, f"{chain}_v4", tracked=family == "inet") + "\t}\n"
    return head + body + "}\n"


def audit_ruleset(*, inet: bool = True, tap: bool = False) -> str:
    """The batch that makes (or keeps, with its elements) the audit tables:
    ``inet`` always, ``tap`` once ``tap0`` exists."""
    batch = ""
    if inet:
        # The name check's own connection onward (CHECK_MARK) is the
        # sandbox's, counted on its way to the check: skipped, its mark kept
        # (the redirect lets it by on that mark). What the redirect took to
        # the check reaches "lo" with its original destination in conntrack.
        # What the sandbox answers (a reply to a connection made to it) is no
        # destination of its own.
        check = f"\t\tmeta mark {CHECK_MARK:#x} accept\n\t\tct direction reply accept\n"
        batch += _table(
            "inet",
            TABLE,
            "output",
            {
                "attempted": f'{check}\t\toifname "lo" accept\n',
                "reached": f'{check}\t\toifname "lo" ct status & dnat == 0 accept\n',
            },
            "meta nfproto ipv4",
            f"meta mark set {KERNEL_MARK:#x}",
        )
    if tap:
        kernel = f"\t\tmeta mark {{ {KERNEL_MARK:#x}, {CHECK_MARK:#x} }} accept\n"
        batch += _table(
            "netdev",
            TAP_TABLE,
            f'egress device "{TAP_NAME}"',
            {"attempted": kernel, "reached": kernel},
            "ether type ip",
            "",
        )
    return batch


@dataclass(frozen=True)
class Counted:
    packets: int
    bytes: int
    #: Seconds until the element expires (its last packet was TIMEOUT - this ago).
    expires: float


def _key(value: Any) -> Key | None:
    concat = value.get("concat") if isinstance(value, dict) else None
    if not isinstance(concat, list) or len(concat) != 3:
        return None
    address, protocol, port = concat
    if not isinstance(address, str) or isinstance(port, bool) or not isinstance(port, int):
        return None
    if isinstance(protocol, int) and not isinstance(protocol, bool):
        protocol = str(protocol)
    if not isinstance(protocol, str):
        return None
    return address, protocol, port


def parse_sets(text: str) -> dict[str, dict[Key, Counted]]:
    """The elements of every set in ``nft -j list table`` output, by set name."""
    doc = json.loads(text) if text.strip() else {}
    found: dict[str, dict[Key, Counted]] = {}
    for item in doc.get("nftables", []):
        body = item.get("set") if isinstance(item, dict) else None
        if not isinstance(body, dict) or not isinstance(body.get("name"), str):
            continue
        elements = found.setdefault(body["name"], {})
        for entry in body.get("elem") or []:
            elem = entry.get("elem") if isinstance(entry, dict) else None
            if not isinstance(elem, dict):
                continue
            key = _key(elem.get("val"))
            counter = elem.get("counter")
            if key is None or not isinstance(counter, dict):
                continue
            expires = elem.get("expires", TIMEOUT)
            elements[key] = Counted(
                int(counter.get("packets", 0)),
                int(counter.get("bytes", 0)),
                float(expires) if isinstance(expires, int | float) else float(TIMEOUT),
            )
    return found


def _sum(tables: Iterable[Mapping[Key, Counted]]) -> dict[Key, Counted]:
    total: dict[Key, Counted] = {}
    for table in tables:
        for key, counted in table.items():
            had = total.get(key)
            if had is None:
                total[key] = counted
            else:
                total[key] = Counted(
                    had.packets + counted.packets,
                    had.bytes + counted.bytes,
                    max(had.expires, counted.expires),
                )
    return total


def destinations(
    tables: Iterable[Mapping[str, Mapping[Key, Counted]]],
    names: Mapping[str, str],
    now: float,
) -> list[Destination]:
    """Each destination of the audit tables (one row per verdict it met),
    named from ``names``, busiest first."""
    listed = list(tables)
    attempted = _sum(t.get("attempted_v4", {}) for t in listed)
    reached = _sum(t.get("reached_v4", {}) for t in listed)
    rows: list[Destination] = []
    for key in attempted.keys() | reached.keys():
        address, protocol, port = key
        tried = attempted.get(key, Counted(0, 0, 0))
        passed = reached.get(key, Counted(0, 0, 0))
        seen = float(round(now - TIMEOUT + max(tried.expires, passed.expires)))
        name = names.get(address)
        if passed.packets:
            rows.append(
                Destination(
                    address, port, protocol, name, "reached", passed.packets, passed.bytes, seen
                )
            )
        # A reached set that was full while the attempted one had room (or the
        # other way round) makes the difference negative: nothing refused then.
        if tried.packets > passed.packets:
            packets, size = tried.packets - passed.packets, max(0, tried.bytes - passed.bytes)
            rows.append(Destination(address, port, protocol, name, "refused", packets, size, seen))
    rows.sort(key=lambda d: (-d.bytes, d.address, d.port, d.protocol, d.verdict))
    return rows


_NAME = re.compile(
    r"^(?=.{1,253}$)([a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?)(\.[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?)*$"
)


class NameBook:
    """Per sandbox, the name podbay's resolver last answered with each address:
    at most :data:`NAMES` addresses, the least recently answered dropped first.

    A name is the question the sandbox asked, kept only once the policy allowed
    it and the upstream answered it, and only if it is a plain host name (a
    sandbox's bytes are not passed on otherwise)."""

    def __init__(self, limit: int = NAMES) -> None:
        self.limit = limit
        self._names: OrderedDict[str, str] = OrderedDict()

    def answered(self, name: str, addresses: Iterable[str]) -> None:
        if not _NAME.match(name):
            return
        for address in addresses:
            self._names[address] = name
            self._names.move_to_end(address)
        while len(self._names) > self.limit:
            self._names.popitem(last=False)

    def names(self) -> dict[str, str]:
        return dict(self._names)

    def clear(self) -> None:
        self._names.clear()
