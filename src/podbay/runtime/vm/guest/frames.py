"""The framing the host relay and the guest demultiplexer speak over one serial port.

The gateway opens many HTTP connections to a machine's agent at once, but a
virtio-serial port is a single byte stream. Each connection becomes a
*stream* numbered by the host; a frame is a 9-byte header (type, stream,
payload length, big-endian) and its payload.

Flow control is per stream: a sender may have at most :data:`WINDOW` bytes of
data unacknowledged; the receiver returns credit (:data:`ACK`) as it delivers
bytes to its own socket. So one connection whose reader is slow never stalls
the others, and neither side ever buffers more than a window per stream.

A session starts with the host's :data:`HELLO` (a nonce) and the guest's
answer, both led by :data:`MAGIC`. The guest drops every stream when it sees a
hello (the host restarted) or when the port reports the host gone; either side
resynchronises by scanning for the magic after anything it cannot parse, so a
frame cut in half by a host killed mid-write costs one retried hello, not the
machine.

Stdlib only: this file is copied into every guest.

>>> header(DATA, 7, 3) + b"abc"
b'\\x04\\x00\\x00\\x00\\x07\\x00\\x00\\x00\\x03abc'
"""

from __future__ import annotations

import struct

HEADER = struct.Struct(">BII")
MAGIC = b"\x00podbay-vm-mux-v1\xff\x00\x13\x37"

HELLO = 1  # host → guest: payload MAGIC + nonce; drop every stream
HELLO_ACK = 2  # guest → host: payload MAGIC + the nonce it answers
OPEN = 3  # host → guest: connect this stream to the agent
DATA = 4  # either way: bytes of a stream
EOF = 5  # either way: no more bytes from this side (half close)
CLOSE = 6  # either way: the stream is gone (reset)
ACK = 7  # either way: payload u32, bytes delivered (credit returned)
HOSTNAME = 8  # host → guest: payload the new hostname (stream 0)
SYNC = 9  # host → guest: write every dirty page to the disks, then answer (payload a nonce)
SYNC_ACK = 10  # guest → host: the SYNC with this nonce is done
CONFIG = 11  # host → guest: JSON {hostname, pids, env} for a guest restored from a template
WAITING = 12  # guest → host: booted as a template, waiting for its CONFIG
CLOCK = 13  # host → guest: payload u64, the host's wall clock (ns since the epoch)

TYPES = frozenset(
    {
        HELLO,
        HELLO_ACK,
        OPEN,
        DATA,
        EOF,
        CLOSE,
        ACK,
        HOSTNAME,
        SYNC,
        SYNC_ACK,
        CONFIG,
        WAITING,
        CLOCK,
    }
)
#: Largest payload in one frame; a bigger length means the stream is out of sync.
MAX_PAYLOAD = 64 * 1024
#: Unacknowledged data bytes a sender may have in flight per stream.
WINDOW = 256 * 1024
NONCE_BYTES = 16

_U32 = struct.Struct(">I")
_U64 = struct.Struct(">Q")


def header(kind: int, stream: int, length: int) -> bytes:
    return HEADER.pack(kind, stream, length)


def frame(kind: int, stream: int, payload: bytes = b"") -> bytes:
    return HEADER.pack(kind, stream, len(payload)) + payload


def ack(stream: int, count: int) -> bytes:
    return frame(ACK, stream, _U32.pack(count))


def ack_count(payload: bytes) -> int:
    value: int = _U32.unpack(payload)[0]
    return value


def clock(now_ns: int) -> bytes:
    """A :data:`CLOCK` frame: the wall clock the guest takes on.

    >>> clock_ns(clock(1_700_000_000_123_456_789)[HEADER.size :])
    1700000000123456789
    """
    return frame(CLOCK, 0, _U64.pack(now_ns))


def clock_ns(payload: bytes) -> int:
    value: int = _U64.unpack(payload)[0]
    return value


def hello(kind: int, nonce: bytes) -> bytes:
    """A hello (or its answer): the magic first, so a reader out of sync finds it."""
    return MAGIC + frame(kind, 0, nonce)


class Parser:
    """Bytes in, frames out; after garbage it scans for the next magic.

    >>> p = Parser(); p.feed(b"junk" + hello(HELLO, b"n" * 16) + frame(OPEN, 1))
    >>> [(k, s, len(b)) for k, s, b in p.frames()]
    [(1, 0, 16), (3, 1, 0)]
    """

    def __init__(self, *, synced: bool = False) -> None:
        self._buf = bytearray()
        self.synced = synced

    def feed(self, data: bytes) -> None:
        self._buf += data

    def reset(self) -> None:
        """Forget everything (the other side went away); wait for a magic."""
        self._buf.clear()
        self.synced = False

    def frames(self) -> list[tuple[int, int, bytes]]:
        out: list[tuple[int, int, bytes]] = []
        buf = self._buf
        while True:
            if not self.synced:
                at = buf.find(MAGIC)
                if at < 0:
                    del buf[: max(0, len(buf) - len(MAGIC) + 1)]
                    return out
                del buf[: at + len(MAGIC)]
                self.synced = True
            elif buf.startswith(MAGIC):
                del buf[: len(MAGIC)]
            elif 0 < len(buf) < len(MAGIC) and MAGIC.startswith(bytes(buf)):
                return out  # maybe a magic still arriving
            if len(buf) < HEADER.size:
                return out
            kind, stream, length = HEADER.unpack_from(buf)
            if kind not in TYPES or length > MAX_PAYLOAD:
                self.synced = False
                del buf[:1]
                continue
            if len(buf) < HEADER.size + length:
                return out
            payload = bytes(buf[HEADER.size : HEADER.size + length])
            del buf[: HEADER.size + length]
            out.append((kind, stream, payload))
