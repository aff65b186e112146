"""The name a TCP connection's first bytes give (pure: no I/O).

A TLS ClientHello names its server in the SNI extension; a plain HTTP/1
request in its ``Host`` header (and, for a proxy-style request, in its
absolute-form target or ``CONNECT`` authority). :func:`sniff` reads what a
client sent so far and says one of:

- :data:`MORE`: it may still become TLS or HTTP; wait for more bytes (within
  the caller's bounds: a client that stops here is cut, or a client could
  pass by sending half a request line and then waiting);
- :class:`Named`: TLS or HTTP, with the names it gives (none: a ClientHello
  without SNI, an HTTP/1.0 request without ``Host``, a literal address);
- :data:`OTHER`: neither TLS nor HTTP/1 (SSH, a database protocol...), so no
  name to check;
- :class:`Malformed`: TLS or HTTP that does not parse (the caller cuts it: a
  server may read a name where this did not).

Input is the sandbox's, so every length is checked against what is there,
and nothing past :data:`MAX_PEEK` bytes is read.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

__all__ = ["MAX_PEEK", "MORE", "OTHER", "Malformed", "Named", "Sniffed", "sniff"]

#: The most a client may send before its name is known: a ClientHello of a
#: whole TLS record (16 KiB) with its header, or an HTTP/1 request head.
MAX_PEEK = 16_384 + 5

_TLS_HANDSHAKE = 0x16
_CLIENT_HELLO = 0x01
_SERVER_NAME = 0x0000
_HOST_NAME = 0x00
#: An HTTP method (RFC 9110 token, in practice capitals) and the space after it.
_METHOD = re.compile(rb"[A-Z][A-Z_-]{0,19} ")
_METHOD_PREFIX = re.compile(rb"[A-Z][A-Z_-]{0,19}")
_REQUEST_LINE = re.compile(rb"([A-Z][A-Z_-]{0,19}) (\S+) HTTP/1\.[01]")
_HOSTNAME = re.compile(r"[a-z0-9_-]+(?:\.[a-z0-9_-]+)*")


@dataclass(frozen=True)
class Named:
    """TLS or HTTP/1, with the names it gives (lowercase, no final dot)."""

    protocol: str
    names: tuple[str, ...]


@dataclass(frozen=True)
class Malformed:
    protocol: str
    why: str


class _Marker:
    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


MORE = _Marker("MORE")
OTHER = _Marker("OTHER")

Sniffed = Named | Malformed | _Marker


def sniff(data: bytes) -> Sniffed:
    """What ``data``, a client's first bytes, says about the name it connects to."""
    if not data:
        return MORE
    if data[0] == _TLS_HANDSHAKE:
        return _tls(data)
    if _METHOD_PREFIX.fullmatch(data[:20]) and len(data) <= 20:
        return MORE  # a method's first letters, or something else: not known yet
    if _METHOD.match(data):
        return _http(data)
    return OTHER


def _name(raw: bytes | str, protocol: str) -> str | Malformed | None:
    """A name as the policy matches it; None for a literal address."""
    text = raw.decode("ascii", "replace") if isinstance(raw, bytes) else raw
    text = text.lower().removesuffix(".")
    if text.startswith("[") or _is_address(text):
        return None
    if len(text) > 253 or not _HOSTNAME.fullmatch(text):
        return Malformed(protocol, f"not a host name: {text[:80]!r}")
    return text


def _is_address(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


# --------------------------------------------------------------------------- TLS


def _tls(data: bytes) -> Sniffed:
    """The ClientHello's SNI. The handshake message may span records: their
    fragments are joined up to :data:`MAX_PEEK` bytes."""
    message = b""
    offset = 0
    while True:
        header = data[offset : offset + 5]
        if len(header) >= 3 and (header[0] != _TLS_HANDSHAKE or header[1] != 3):
            # Not a TLS 1.x handshake record: the first one is not TLS at all,
            # a later one cannot follow a ClientHello's fragment.
            return OTHER if offset == 0 else Malformed("tls", "a record that is no handshake")
        if len(header) < 5:
            return MORE
        length = int.from_bytes(header[3:5], "big")
        if length == 0 or length > 16_384:
            return Malformed("tls", f"record length {length}")
        fragment = data[offset + 5 : offset + 5 + length]
        if len(fragment) < length:
            return MORE
        message += fragment
        offset += 5 + length
        if len(message) >= 4:
            if message[0] != _CLIENT_HELLO:
                return Malformed("tls", "the first handshake message is no ClientHello")
            needed = 4 + int.from_bytes(message[1:4], "big")
            if needed > MAX_PEEK:
                return Malformed("tls", f"a ClientHello of {needed} bytes")
            if len(message) >= needed:
                return _client_hello(message[4:needed])


class _Reader:
    """Reads a ClientHello; :class:`ValueError` on anything short or wrong."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.at = 0

    def take(self, size: int) -> bytes:
        if self.at + size > len(self.data):
            raise ValueError("truncated")
        out = self.data[self.at : self.at + size]
        self.at += size
        return out

    def number(self, size: int) -> int:
        return int.from_bytes(self.take(size), "big")

    def vector(self, length_size: int) -> bytes:
        return self.take(self.number(length_size))

    def left(self) -> int:
        return len(self.data) - self.at


def _client_hello(body: bytes) -> Sniffed:
    try:
        reader = _Reader(body)
        reader.take(2 + 32)  # legacy version, random
        reader.vector(1)  # session id
        reader.vector(2)  # cipher suites
        reader.vector(1)  # compression methods
        if reader.left() == 0:
            return Named("tls", ())  # no extensions at all: no SNI
        extensions = _Reader(reader.vector(2))
        names: list[str] = []
        seen: set[int] = set()
        while extensions.left():
            kind = extensions.number(2)
            content = extensions.vector(2)
            if kind in seen:
                return Malformed("tls", f"extension {kind} twice")
            seen.add(kind)
            if kind == _SERVER_NAME:
                found = _server_names(content)
                if isinstance(found, Malformed):
                    return found
                names += found
    except ValueError:
        return Malformed("tls", "a ClientHello cut short")
    return Named("tls", tuple(names))


def _server_names(content: bytes) -> list[str] | Malformed:
    entries = _Reader(_Reader(content).vector(2))
    names: list[str] = []
    while entries.left():
        kind = entries.number(1)
        raw = entries.vector(2)
        if kind != _HOST_NAME:
            continue
        name = _name(raw, "tls")
        if isinstance(name, Malformed):
            return name
        if name is not None:
            names.append(name)
    return names


# --------------------------------------------------------------------------- HTTP/1


def _http(data: bytes) -> Sniffed:
    end_of_line = data.find(b"\n")
    if end_of_line < 0:
        return MORE if len(data) < MAX_PEEK else Malformed("http", "no end of request line")
    line = data[:end_of_line].rstrip(b"\r")
    request = _REQUEST_LINE.fullmatch(line)
    if request is None:
        return OTHER  # a method-like word and a space, but no HTTP/1 request line
    end = data.find(b"\r\n\r\n")
    bare = data.find(b"\n\n")
    ends = [i for i in (end, bare) if i >= 0]
    if not ends:
        return MORE if len(data) < MAX_PEEK else Malformed("http", "a request head too large")
    head = data[: min(ends)].decode("latin-1")
    names: list[str] = []
    hosts = 0
    for header in head.splitlines()[1:]:
        key, colon, value = header.partition(":")
        if not colon or key != key.strip():
            return Malformed("http", "a header line without a name")
        if key.lower() == "host":
            hosts += 1
            found = _authority(value.strip())
            if isinstance(found, Malformed):
                return found
            if found is not None:
                names.append(found)
    if hosts > 1:
        return Malformed("http", "Host twice")
    method, target = request.group(1).decode(), request.group(2).decode("latin-1")
    authority: str | None = None
    if method == "CONNECT":
        authority = target
    elif "://" in target:
        authority = target.split("://", 1)[1].split("/", 1)[0].split("?", 1)[0]
    if authority is not None:
        found = _authority(authority.rsplit("@", 1)[-1])
        if isinstance(found, Malformed):
            return found
        if found is not None:
            names.append(found)
    return Named("http", tuple(dict.fromkeys(names)))


def _authority(value: str) -> str | Malformed | None:
    """``host[:port]`` (or ``[v6]:port``) as a name; None for an address or nothing."""
    if not value:
        return None
    if value.startswith("["):
        return None
    host, _, port = value.partition(":")
    if port and not port.isdigit():
        return Malformed("http", f"a port that is no number: {value[:80]!r}")
    return _name(host, "http")
