"""A sandbox's egress policy: where it may send packets, checked (pure: no I/O).

The wire form is one JSON object (the ``network`` of attach, the sandbox
section, ``GET``/``PUT /api/v1/sandboxes/{name}/network``)::

    {}                                  open: the internet, as without a policy
    {"internet": false}                 no egress at all (DNS included)
    {"allow": [...], "deny": [...]}     lists of CIDRs and domain names

An entry is an IPv4 or IPv6 CIDR (a bare address is its /32 or /128), a
domain name (``pypi.org``) or a wildcard (``*.pypi.org``: every name under
it, not the name itself). Deny wins over allow; an allow list makes
everything it does not name refused. Whatever the policy says, the
host/cluster/metadata refusals of :mod:`podbay.runtime.network.policy`
stay: a policy narrows egress, it never widens it.

Everything here is the caller's input: a policy that is not one is refused
with a code naming what is wrong (:class:`~podbay.errors.ApiError`).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ..errors import ApiError
from ..wire.codes import ErrorCode

__all__ = [
    "MAX_ENTRIES",
    "MAX_NAME_LENGTH",
    "OPEN",
    "EgressPolicy",
    "Network",
    "names",
    "networks",
    "parse_entry",
]

#: Entries of ``allow`` and ``deny`` together: each is a set element in the
#: sandbox's rules and a name its resolver matches per query.
MAX_ENTRIES = 256
#: A domain name's longest text form (RFC 1035, without the final dot).
MAX_NAME_LENGTH = 253
_LABEL = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?")
_KEYS = frozenset({"internet", "allow", "deny"})

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def _entry_error(entry: object, why: str) -> ApiError:
    shown = entry[:80] if isinstance(entry, str) else type(entry).__name__
    return ApiError(ErrorCode.SANDBOX_NETWORK_ENTRY_INVALID, f"network entry {shown!r}: {why}")


def _network(text: str) -> Network | None:
    """``text`` as a CIDR, None when it is not an address at all."""
    address = text.split("/", 1)[0]
    try:
        ipaddress.ip_address(address)
    except ValueError:
        return None
    try:
        return ipaddress.ip_network(text, strict=True)
    except ValueError as exc:
        # An address with host bits under its prefix is ambiguous (a typo, or
        # meant as the network?): the caller says which.
        raise _entry_error(text, str(exc)) from None


def _domain(text: str) -> str:
    name = text.lower().removesuffix(".")
    bare = name.removeprefix("*.")
    if not name.isascii():
        raise _entry_error(text, "write an international name in its ASCII (xn--) form")
    if len(name) > MAX_NAME_LENGTH:
        raise _entry_error(text, f"a domain name is at most {MAX_NAME_LENGTH} characters")
    labels = bare.split(".")
    if len(labels) < 2 or not all(_LABEL.fullmatch(label) for label in labels):
        raise _entry_error(
            text,
            "neither a CIDR nor a domain name (dot-separated labels of letters, digits "
            "and inner hyphens, at least two; a wildcard only as a leading '*.')",
        )
    if labels[-1].isdigit():
        raise _entry_error(text, "an all-numeric top-level label is an address, not a name")
    return name


def parse_entry(entry: object) -> str:
    """The canonical form of one ``allow``/``deny`` entry: a CIDR's network text
    (``192.0.2.7`` → ``192.0.2.7/32``) or a lowercase name without a final dot."""
    if not isinstance(entry, str) or not entry:
        raise _entry_error(entry, "an entry is a non-empty string")
    net = _network(entry)
    return str(net) if net is not None else _domain(entry)


def _entries(doc: dict[str, Any], key: str) -> tuple[str, ...]:
    value = doc.get(key, [])
    if not isinstance(value, list):
        raise ApiError(ErrorCode.SANDBOX_NETWORK_INVALID, f"network.{key} is a list of strings")
    # Order kept (it is what GET shows back), duplicates dropped.
    return tuple(dict.fromkeys(parse_entry(item) for item in value))


@dataclass(frozen=True, kw_only=True)
class EgressPolicy:
    internet: bool = True
    allow: tuple[str, ...] = ()
    deny: tuple[str, ...] = ()

    @classmethod
    def parse(cls, doc: object) -> EgressPolicy:
        """The policy ``doc`` (decoded JSON) describes, or :class:`ApiError`."""
        if not isinstance(doc, dict):
            raise ApiError(ErrorCode.SANDBOX_NETWORK_INVALID, "network is a JSON object")
        unknown = sorted(str(k)[:40] for k in doc if k not in _KEYS)
        if unknown:
            raise ApiError(
                ErrorCode.SANDBOX_NETWORK_INVALID,
                f"network has unknown keys {unknown}; it takes internet, allow, deny",
            )
        internet = doc.get("internet", True)
        if not isinstance(internet, bool):
            raise ApiError(ErrorCode.SANDBOX_NETWORK_INVALID, "network.internet is true or false")
        for key in ("allow", "deny"):
            value = doc.get(key, [])
            if isinstance(value, list) and len(value) > MAX_ENTRIES:
                raise ApiError(
                    ErrorCode.SANDBOX_NETWORK_TOO_LARGE,
                    f"network.{key} has {len(value)} entries; at most {MAX_ENTRIES} in all",
                )
        allow, deny = _entries(doc, "allow"), _entries(doc, "deny")
        if len(allow) + len(deny) > MAX_ENTRIES:
            raise ApiError(
                ErrorCode.SANDBOX_NETWORK_TOO_LARGE,
                f"network has {len(allow) + len(deny)} entries; at most {MAX_ENTRIES} in all",
            )
        if not internet and (allow or deny):
            # One meaning only: "no egress at all" with an exception list would
            # be an allow list, which says so itself.
            raise ApiError(
                ErrorCode.SANDBOX_NETWORK_INVALID,
                "network.internet false takes no allow or deny list "
                "(an allow list alone already refuses everything it does not name)",
            )
        return cls(internet=internet, allow=allow, deny=deny)

    @property
    def open(self) -> bool:
        """Whether the policy adds nothing to the platform's own refusals."""
        return self.internet and not self.allow and not self.deny

    @property
    def default_deny(self) -> bool:
        """Whether a destination the policy does not name is refused."""
        return not self.internet or bool(self.allow)

    @property
    def has_names(self) -> bool:
        """Whether a domain entry needs podbay's resolver to hold."""
        return bool(names(self.allow) or names(self.deny))

    def allows_name(self, name: str) -> bool:
        """Whether the sandbox may resolve ``name``: not denied (deny wins), and
        allowed by an entry or by an open default. ``pypi.org`` matches itself
        only; ``*.pypi.org`` every name under it, not ``pypi.org`` itself."""
        name = name.lower().removesuffix(".")
        if not self.internet or _matches(name, self.deny):
            return False
        return _matches(name, self.allow) if self.allow else True

    def allows_named(self, name: str, address: str) -> bool:
        """Whether a connection to ``address`` that names ``name`` (its TLS SNI,
        its HTTP ``Host``) may go on: not a denied name (deny wins, whatever the
        address), and under an allow list an allowed name, or an address the
        list allows as a CIDR (names never narrow what an address entry opens)."""
        name = name.lower().removesuffix(".")
        if not self.internet or _matches(name, self.deny):
            return False
        if not self.allow or _matches(name, self.allow):
            return True
        ip = ipaddress.ip_address(address)
        return any(ip in net for net in networks(self.allow) if net.version == ip.version)

    def to_doc(self) -> dict[str, Any]:
        """The wire form; ``{}`` for an open policy."""
        if not self.internet:
            return {"internet": False}
        doc: dict[str, Any] = {}
        if self.allow:
            doc["allow"] = list(self.allow)
        if self.deny:
            doc["deny"] = list(self.deny)
        return doc

    def to_json(self) -> str:
        return json.dumps(self.to_doc(), sort_keys=True)

    @classmethod
    def from_json(cls, text: str | None) -> EgressPolicy:
        return cls.parse(json.loads(text)) if text else OPEN


def networks(entries: Iterable[str]) -> list[Network]:
    """The CIDRs among canonical entries (the names are left out)."""
    out: list[Network] = []
    for entry in entries:
        net = _network(entry)
        if net is not None:
            out.append(net)
    return out


def names(entries: Iterable[str]) -> list[str]:
    """The domain names and wildcards among canonical entries."""
    return [entry for entry in entries if _network(entry) is None]


def _matches(name: str, entries: Iterable[str]) -> bool:
    for entry in names(entries):
        if entry.startswith("*."):
            if name.endswith(entry[1:]):
                return True
        elif name == entry:
            return True
    return False


OPEN = EgressPolicy()


#: Seconds a destination stays in a sandbox's egress audit after its last packet.
AUDIT_SECONDS = 3600
#: Destinations (address, protocol, port) the audit holds at each hook; once
#: full, new ones go unrecorded until old ones expire.
AUDIT_SIZE = 4096


@dataclass(frozen=True)
class EgressDestination:
    """One row of a sandbox's egress audit (docs/network.md, "Audit"): a
    destination it reached, or was refused, lately."""

    address: str
    port: int
    #: ``tcp``, ``udp``, ``icmp``, or the protocol's number.
    protocol: str
    #: What podbay's resolver last answered with this address; None when it
    #: answered none (no resolver under a policy without names, or on gVisor).
    name: str | None
    #: ``reached`` or ``refused``.
    verdict: str
    packets: int
    bytes: int
    #: Unix time of the last packet to this destination (whichever verdict).
    last_seen: float

    def to_doc(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_doc(cls, doc: dict[str, Any]) -> EgressDestination:
        name = doc.get("name")
        return cls(
            address=str(doc["address"]),
            port=int(doc["port"]),
            protocol=str(doc["protocol"]),
            name=None if name is None else str(name),
            verdict=str(doc["verdict"]),
            packets=int(doc["packets"]),
            bytes=int(doc["bytes"]),
            last_seen=float(doc["last_seen"]),
        )
