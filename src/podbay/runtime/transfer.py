"""A stopped machine's disk as one byte stream, for moving it to another node.

What travels is the machine's record (spec, base image) and its sparse ext4
file, holes left out: a 10 GiB disk holding 100 MiB sends about 100 MiB.
The stream ends with the SHA-256 of every byte before it, computed by the
sender as it sent them; the receiver computes its own over what arrived and
refuses the machine when the two differ (checked at both ends). Format::

    MAGIC
    u32 length, JSON {"record": ..., "size": bytes,     the header
                      "data": bytes of extents}
    (u64 offset, u32 length, data) ...                  extents, <= CHUNK each
    u64 END, u32 32, SHA-256 of everything above        the end

Integers are big-endian. Reading and hashing run in a worker thread per
chunk, so the event loop serving other sandboxes never waits on the disk.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import struct
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from podbay.errors import DriverError
from podbay.host.storage import data_extents

MAGIC = b"podbay-disk/1\n"
CHUNK = 1 << 20
END = (1 << 64) - 1
_FRAME = struct.Struct(">QI")
_LENGTH = struct.Struct(">I")
MAX_HEADER = 1 << 20


@dataclass(frozen=True)
class Received:
    """What a receiver wrote: its byte count and both ends' digests."""

    bytes: int
    #: SHA-256 (hex) of what arrived, computed by the receiver.
    sha256: str
    #: SHA-256 (hex) the sender computed over what it sent (the stream's end).
    sent_sha256: str


async def send(disk: Path, record: dict[str, Any]) -> AsyncGenerator[bytes, None]:
    """The stream of ``disk`` (opened now, read as it goes) and ``record``."""
    fd = os.open(disk, os.O_RDONLY | os.O_CLOEXEC)
    try:
        digest = hashlib.sha256()
        size = os.fstat(fd).st_size
        extents = await asyncio.to_thread(data_extents, fd)
        data = sum(length for _, length in extents)
        header = json.dumps({"record": record, "size": size, "data": data}).encode()
        first = MAGIC + _LENGTH.pack(len(header)) + header
        digest.update(first)
        yield first
        for start, length in extents:
            offset = start
            while offset < start + length:
                want = min(CHUNK, start + length - offset)
                frame = await asyncio.to_thread(_frame, fd, offset, want, digest)
                offset += want
                yield frame
        yield _FRAME.pack(END, 32) + digest.digest()
    finally:
        os.close(fd)


def _frame(fd: int, offset: int, length: int, digest: Any) -> bytes:
    data = os.pread(fd, length, offset)
    if len(data) != length:
        raise DriverError(f"the disk shrank while it was read (at {offset})")
    frame = _FRAME.pack(offset, length) + data
    digest.update(frame)
    return frame


class _Reader:
    """Exact reads from a chunked byte stream."""

    def __init__(self, chunks: AsyncIterator[bytes]) -> None:
        self.chunks = chunks
        self.buffer = bytearray()
        self.total = 0

    async def exactly(self, n: int) -> bytes:
        while len(self.buffer) < n:
            try:
                chunk = await anext(self.chunks)
            except StopAsyncIteration:
                raise DriverError("the disk stream ended early") from None
            self.buffer += chunk
        out = bytes(self.buffer[:n])
        del self.buffer[:n]
        self.total += n
        return out


async def receive(
    chunks: AsyncIterator[bytes],
    disk: Path,
    room: Callable[[int], str | None] | None = None,
) -> tuple[dict[str, Any], Received]:
    """Write the stream's disk to ``disk`` (created, sparse) and return its
    header's record and what arrived. Raises :class:`DriverError` when the
    stream is malformed, short, or its digest is not what was sent, and
    before writing anything when ``room`` (given the bytes the disk holds)
    says why there is no room for it."""
    reader = _Reader(chunks)
    digest = hashlib.sha256()
    head = await reader.exactly(len(MAGIC) + _LENGTH.size)
    if head[: len(MAGIC)] != MAGIC:
        raise DriverError("not a podbay disk stream")
    (length,) = _LENGTH.unpack(head[len(MAGIC) :])
    if length > MAX_HEADER:
        raise DriverError("the disk stream's header is too long")
    raw = await reader.exactly(length)
    digest.update(head + raw)
    try:
        header = json.loads(raw)
        record, size, holds = header["record"], int(header["size"]), int(header["data"])
    except (ValueError, KeyError, TypeError):
        raise DriverError("the disk stream's header is not valid") from None
    short = room(holds) if room is not None else None
    if short is not None:
        raise DriverError(short)
    fd = os.open(disk, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        os.ftruncate(fd, size)
        while True:
            frame = await reader.exactly(_FRAME.size)
            offset, length = _FRAME.unpack(frame)
            if offset == END:
                sent = (await reader.exactly(length)).hex()
                break
            if length > CHUNK or offset + length > size:
                raise DriverError("the disk stream names an extent outside the disk")
            data = await reader.exactly(length)
            await asyncio.to_thread(_write, fd, frame, data, offset, digest)
        received = digest.hexdigest()
        if sent != received:
            raise DriverError(f"the disk arrived damaged: sent sha256 {sent}, received {received}")
        await asyncio.to_thread(os.fsync, fd)
    finally:
        os.close(fd)
    return record, Received(bytes=reader.total, sha256=received, sent_sha256=sent)


def _write(fd: int, frame: bytes, data: bytes, offset: int, digest: Any) -> None:
    digest.update(frame)
    digest.update(data)
    os.pwrite(fd, data, offset)
