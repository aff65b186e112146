"""The disk stream a stopped machine moves between nodes in: holes stay holes,
both ends' SHA-256 agree, and a damaged or short stream is refused (the
driver then removes what was written: tests/integration/cluster)."""

from __future__ import annotations

import asyncio
import hashlib
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from podbay.runtime.base import DriverError
from podbay.runtime.transfer import CHUNK, receive, send

MIB = 1 << 20


def sparse_disk(path: Path) -> bytes:
    """A 64 MiB file with data at three places (one extent over several chunks)."""
    with open(path, "wb") as f:
        f.truncate(64 * MIB)
    pieces = {0: os.urandom(4096), 10 * MIB: os.urandom(3 * CHUNK + 17), 63 * MIB: b"end"}
    fd = os.open(path, os.O_WRONLY)
    try:
        for offset, data in pieces.items():
            os.pwrite(fd, data, offset)
    finally:
        os.close(fd)
    return path.read_bytes()


async def collect(path: Path) -> list[bytes]:
    return [chunk async for chunk in send(path, {"spec": {"machine_id": "m-1"}})]


async def feed(chunks: list[bytes]) -> AsyncIterator[bytes]:
    for chunk in chunks:
        yield chunk


def test_a_sparse_disk_arrives_whole_and_stays_sparse(tmp_path: Path) -> None:
    content = sparse_disk(tmp_path / "disk")
    chunks = asyncio.run(collect(tmp_path / "disk"))
    sent = sum(len(c) for c in chunks)
    assert sent < 4 * MIB  # holes are not sent
    record, got = asyncio.run(receive(feed(chunks), tmp_path / "copy"))
    assert record == {"spec": {"machine_id": "m-1"}}
    assert (tmp_path / "copy").read_bytes() == content
    assert got.sha256 == got.sent_sha256 == hashlib.sha256(b"".join(chunks[:-1])).hexdigest()
    assert got.bytes == sent
    assert os.stat(tmp_path / "copy").st_blocks * 512 < 8 * MIB


@pytest.mark.parametrize("damage", ["flip", "short"])
def test_a_damaged_stream_is_refused(tmp_path: Path, damage: str) -> None:
    sparse_disk(tmp_path / "disk")
    chunks = asyncio.run(collect(tmp_path / "disk"))
    if damage == "flip":
        middle = bytearray(chunks[2])
        middle[len(middle) // 2] ^= 1
        chunks[2] = bytes(middle)
        expect = "arrived damaged"
    else:
        chunks = chunks[:-2]
        expect = "ended early"
    with pytest.raises(DriverError, match=expect):
        asyncio.run(receive(feed(chunks), tmp_path / "copy"))


def test_a_disk_without_room_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    sparse_disk(tmp_path / "disk")
    chunks = asyncio.run(collect(tmp_path / "disk"))
    asked: list[int] = []

    def room(data: int) -> str | None:
        asked.append(data)
        return "no room"

    with pytest.raises(DriverError, match="no room"):
        asyncio.run(receive(feed(chunks), tmp_path / "copy", room))
    # The bytes its extents hold (whole file-system blocks), not its 64 MiB size.
    assert len(asked) == 1
    assert 4096 + 3 * CHUNK + 17 + 3 <= asked[0] < 4 * MIB
    assert not (tmp_path / "copy").exists()
