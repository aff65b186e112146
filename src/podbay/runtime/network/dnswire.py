"""The few DNS message facts podbay's resolver needs (RFC 1035; pure, no I/O):
a query's one question, a refusal of it, and the A records of an answer.

Everything here reads a sandbox's bytes or an upstream's: a message that is
not what it claims is ``None``/empty, never an exception past this module.
"""

from __future__ import annotations

import ipaddress
import struct
from dataclasses import dataclass

__all__ = ["Question", "a_records", "question", "refusal"]

_HEADER = struct.Struct("!HHHHHH")
_QR = 0x8000
_RD = 0x0100
_RA = 0x0080
_REFUSED = 5
_TYPE_A = 1
_CLASS_IN = 1
#: Pointers followed per name at most (a loop of pointers ends here).
_MAX_JUMPS = 32


@dataclass(frozen=True)
class Question:
    id: int
    flags: int
    #: Lowercase, dot-joined, no final dot.
    name: str
    qtype: int
    #: Where the question ends: header + question is what an answer echoes.
    end: int


def _name(data: bytes, offset: int) -> tuple[str, int] | None:
    """The name at ``offset`` and where it ends in the message (after its first
    pointer, if any)."""
    labels: list[str] = []
    end: int | None = None
    for _ in range(_MAX_JUMPS):
        if offset >= len(data):
            return None
        length = data[offset]
        if length & 0xC0 == 0xC0:
            if offset + 1 >= len(data):
                return None
            if end is None:
                end = offset + 2
            offset = ((length & 0x3F) << 8) | data[offset + 1]
            continue
        if length & 0xC0:
            return None
        if length == 0:
            name = ".".join(labels).lower()
            return (name, end if end is not None else offset + 1) if len(name) <= 253 else None
        label = data[offset + 1 : offset + 1 + length]
        if len(label) != length:
            return None
        labels.append(label.decode("ascii", errors="replace"))
        offset += 1 + length
    return None


def question(data: bytes) -> Question | None:
    """The one question of a query; None for a response or anything else."""
    if len(data) < _HEADER.size:
        return None
    ident, flags, qdcount, _, _, _ = _HEADER.unpack_from(data)
    if flags & _QR or qdcount != 1:
        return None
    found = _name(data, _HEADER.size)
    if found is None or found[1] + 4 > len(data):
        return None
    name, offset = found
    qtype, _ = struct.unpack_from("!HH", data, offset)
    return Question(ident, flags, name, qtype, offset + 4)


def refusal(data: bytes, asked: Question) -> bytes:
    """The answer REFUSED to ``asked`` (its question echoed, nothing else)."""
    flags = _QR | (asked.flags & _RD) | _RA | _REFUSED
    return _HEADER.pack(asked.id, flags, 1, 0, 0, 0) + data[_HEADER.size : asked.end]


def a_records(data: bytes) -> list[tuple[str, int]]:
    """The IPv4 addresses an answer gives, each with its TTL in seconds."""
    if len(data) < _HEADER.size:
        return []
    _, flags, qdcount, ancount, _, _ = _HEADER.unpack_from(data)
    if not flags & _QR:
        return []
    offset = _HEADER.size
    for _ in range(qdcount):
        found = _name(data, offset)
        if found is None:
            return []
        offset = found[1] + 4
    out: list[tuple[str, int]] = []
    for _ in range(ancount):
        found = _name(data, offset)
        if found is None or found[1] + 10 > len(data):
            return out
        rtype, rclass, ttl, length = struct.unpack_from("!HHIH", data, found[1])
        start = found[1] + 10
        if start + length > len(data):
            return out
        if rtype == _TYPE_A and rclass == _CLASS_IN and length == 4:
            out.append((str(ipaddress.IPv4Address(data[start : start + 4])), ttl))
        offset = start + length
    return out
