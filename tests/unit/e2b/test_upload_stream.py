"""``/files`` upload bodies are streamed (podbay.e2b._upload): a part's bytes
are handed on before the body has all arrived, gzip is inflated in bounded
steps, and a malformed or cut body is a 400, not a 500."""

from __future__ import annotations

import gzip
import hashlib
from collections.abc import AsyncIterator

import pytest

from podbay.e2b import _upload
from podbay.e2b.error_responses import E2BError

pytestmark = pytest.mark.anyio

BOUNDARY = b"xYzZY"


def _part(filename: str, data: bytes) -> bytes:
    return (
        b"--" + BOUNDARY + b"\r\n"
        b'Content-Disposition: form-data; name="file"; filename="' + filename.encode() + b'"\r\n'
        b"Content-Type: application/octet-stream\r\n\r\n" + data + b"\r\n"
    )


async def _chunks(*chunks: bytes) -> AsyncIterator[bytes]:
    for chunk in chunks:
        yield chunk


async def test_a_part_streams_before_the_body_ends() -> None:
    handed_on: list[bytes] = []
    pulled_after_first = False

    async def body() -> AsyncIterator[bytes]:
        nonlocal pulled_after_first
        yield _part("a.bin", b"A" * 100_000)[:60_000]
        # By now the first bytes of the part must have been handed on.
        pulled_after_first = bool(handed_on)
        yield _part("a.bin", b"A" * 100_000)[60_000:]
        yield _part("b.txt", b"B")
        yield b"--" + BOUNDARY + b"--\r\n"

    files = _upload.MultipartFiles(body(), BOUNDARY)
    got: dict[str, bytes] = {}
    while (name := await files.next_file()) is not None:
        async for chunk in files.data():
            handed_on.append(chunk)
            got[name] = got.get(name, b"") + chunk
    assert pulled_after_first
    assert got == {"a.bin": b"A" * 100_000, "b.txt": b"B"}


async def test_trailing_digest_follows_the_bytes() -> None:
    out = b"".join([c async for c in _upload.with_trailing_digest(_chunks(b"ab", b"cd"))])
    assert out == b"abcd" + hashlib.sha256(b"abcd").hexdigest().encode()


async def test_gzip_streams_and_a_bomb_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    data = b"compressible " * 50_000
    packed = gzip.compress(data)
    halves = (packed[: len(packed) // 2], packed[len(packed) // 2 :])
    inflated = [c async for c in _upload.inflated(_chunks(*halves), "gzip")]
    assert b"".join(inflated) == data
    monkeypatch.setattr(_upload, "MAX_UPLOAD", 100_000)
    with pytest.raises(E2BError) as refused:
        async for _ in _upload.inflated(_chunks(packed), "gzip"):
            pass
    assert refused.value.status == 413


@pytest.mark.parametrize(
    "body",
    [
        _part("a", b"cut short"),  # no closing boundary
        b"--" + BOUNDARY + b"\r\nbroken header line without colon\r\n\r\n",
        b"not multipart at all",
    ],
)
async def test_malformed_or_cut_bodies_are_400(body: bytes) -> None:
    files = _upload.MultipartFiles(_chunks(body), BOUNDARY)

    async def read_all() -> None:
        while await files.next_file() is not None:
            async for _ in files.data():
                pass

    with pytest.raises(E2BError) as refused:
        await read_all()
    assert refused.value.status == 400
