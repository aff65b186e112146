"""An envd ``/files`` upload body, streamed: each file's bytes are handed on as
they arrive, never held whole (a 10 MiB write used to be buffered twice and
parsed by the standard library's ``email`` parser, a second of CPU).

The multipart boundary search is ``python-multipart``'s streaming parser; a
gzip body is inflated as it streams, in bounded steps, so a small bomb is
refused at :data:`MAX_UPLOAD` bytes rather than expanded.
"""

from __future__ import annotations

import asyncio
import hashlib
import zlib
from collections import deque
from collections.abc import AsyncIterator

from python_multipart.exceptions import MultipartParseError
from python_multipart.multipart import MultipartParser, parse_options_header

from .error_responses import E2BError

#: The most bytes one upload may carry, inflated.
MAX_UPLOAD = 256 * 1024 * 1024
#: Inflated bytes produced per step (a gzip bomb never expands past this at once).
_INFLATE_STEP = 1024 * 1024
#: Bytes of an upload gathered before they go on to the data plane.
_SEND_STEP = 256 * 1024


async def inflated(stream: AsyncIterator[bytes], encoding: str) -> AsyncIterator[bytes]:
    """The body's bytes, inflated when ``encoding`` is gzip, at most ``MAX_UPLOAD``."""
    if encoding not in ("", "identity", "gzip"):
        raise E2BError(
            415, "CONTENT_ENCODING_UNSUPPORTED", f"Content-Encoding {encoding!r}: gzip only"
        )
    inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS) if encoding == "gzip" else None
    total = 0
    async for chunk in stream:
        pending = chunk
        while pending:
            if inflater is None:
                out, pending = pending, b""
            else:
                try:
                    out = inflater.decompress(pending, _INFLATE_STEP)
                except zlib.error as exc:
                    raise E2BError(
                        400, "REQUEST_INVALID", f"the gzip body is corrupt: {exc}"
                    ) from None
                pending = inflater.unconsumed_tail
            total += len(out)
            if total > MAX_UPLOAD:
                raise E2BError(413, "REQUEST_TOO_LARGE", f"uploads are at most {MAX_UPLOAD} bytes")
            if out:
                yield out
    if inflater is not None and not inflater.eof:
        raise E2BError(400, "REQUEST_INVALID", "the gzip body is cut short")


async def with_trailing_digest(chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """``chunks``, then their hex SHA-256: the agent's one-pass (trailing) digest.

    The bytes go on in blocks of :data:`_SEND_STEP` (the server's reads are
    far smaller: fewer, larger writes to the data plane), and each block is
    hashed in a worker thread (``hashlib`` lets go of the GIL) while it is
    sent, so the hash is not in series with the transfer."""
    hasher = hashlib.sha256()
    loop = asyncio.get_running_loop()
    hashing: asyncio.Future[None] | None = None
    batch: list[bytes] = []
    size = 0
    async for chunk in chunks:
        batch.append(chunk)
        size += len(chunk)
        if size < _SEND_STEP:
            continue
        block = b"".join(batch)
        batch.clear()
        size = 0
        if hashing is not None:  # one block at a time: updates stay in order
            await hashing
        hashing = loop.run_in_executor(None, hasher.update, block)
        yield block
    if hashing is not None:
        await hashing
    if batch:
        block = b"".join(batch)
        hasher.update(block)
        yield block
    yield hasher.hexdigest().encode("ascii")


def boundary_of(content_type: str) -> bytes:
    """The boundary of a ``multipart/form-data`` content type."""
    _, options = parse_options_header(content_type)
    boundary = options.get(b"boundary", b"")
    if not boundary or len(boundary) > 200:
        raise E2BError(400, "REQUEST_INVALID", "the multipart body names no usable boundary")
    return boundary


class MultipartFiles:
    """The parts of a multipart body, one after another: :meth:`next_file` gives
    a part's file name, then :meth:`data` streams that part's bytes."""

    def __init__(self, body: AsyncIterator[bytes], boundary: bytes) -> None:
        self._body = body
        self._events: deque[tuple[str, bytes]] = deque()
        self._field = bytearray()
        self._value = bytearray()
        self._disposition = b""
        self._ended = False
        self._parser = MultipartParser(
            boundary,
            callbacks={
                "on_part_begin": self._part_begin,
                "on_header_field": lambda data, start, end: self._field.extend(data[start:end]),
                "on_header_value": lambda data, start, end: self._value.extend(data[start:end]),
                "on_header_end": self._header_end,
                "on_headers_finished": self._headers_finished,
                "on_part_data": lambda data, start, end: self._events.append(
                    ("data", bytes(data[start:end]))
                ),
                "on_part_end": lambda: self._events.append(("end", b"")),
                "on_end": self._end,
            },
        )

    def _part_begin(self) -> None:
        self._disposition = b""

    def _header_end(self) -> None:
        if bytes(self._field).strip().lower() == b"content-disposition":
            self._disposition = bytes(self._value)
        self._field.clear()
        self._value.clear()

    def _headers_finished(self) -> None:
        _, options = parse_options_header(self._disposition)
        name = options.get(b"filename", b"")
        self._events.append(("begin", name))

    def _end(self) -> None:
        self._ended = True

    async def _next(self) -> tuple[str, bytes] | None:
        while not self._events:
            if self._ended:
                return None
            chunk = await anext(self._body, None)
            if chunk is None:
                raise E2BError(400, "REQUEST_INVALID", "the multipart body is cut short")
            try:
                self._parser.write(chunk)
            except MultipartParseError as exc:
                raise E2BError(
                    400, "REQUEST_INVALID", f"the multipart body is malformed: {exc}"
                ) from None
        return self._events.popleft()

    async def next_file(self) -> str | None:
        """The next part's file name ("" when it names none); None after the last."""
        while (event := await self._next()) is not None:
            kind, value = event
            if kind == "begin":
                return value.decode("utf-8", "replace")
        return None

    async def data(self) -> AsyncIterator[bytes]:
        """The current part's bytes, as they arrive."""
        while (event := await self._next()) is not None:
            kind, value = event
            if kind == "end":
                return
            yield value
        raise E2BError(400, "REQUEST_INVALID", "the multipart body is cut short")
