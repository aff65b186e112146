"""The newest N bytes of a stream, read by byte offset, never splitting UTF-8.

Offsets count bytes since the stream began. The buffer keeps the newest
``capacity`` bytes (oldest discarded first); byte ``o`` lives at index
``o % capacity``, so writing never moves what is already there. It grows as
needed, so a quiet process costs no more than it wrote.

:meth:`Ring.read_from` answers a poll: the text after an offset, the next
offset, and how many bytes were lost before the text. It never splits a
UTF-8 character between two polls: an incomplete trailing sequence waits
while the stream is open, and when the retained window begins in the middle
of a character those continuation bytes count as dropped.
"""

from __future__ import annotations


def incomplete_tail(data: bytes | bytearray) -> int:
    """How many trailing bytes of ``data`` start a UTF-8 character that is not
    complete yet (0 to 3).

    >>> incomplete_tail("é".encode()[:1]), incomplete_tail("😀".encode()[:3])
    (1, 3)
    >>> incomplete_tail(b"ab"), incomplete_tail("😀".encode())
    (0, 0)
    """
    n = len(data)
    for back in range(1, min(4, n) + 1):
        byte = data[n - back]
        if byte & 0xC0 == 0x80:  # continuation byte: keep looking for the lead
            continue
        if byte >= 0xF8:  # never valid in UTF-8: nothing to wait for
            return 0
        if byte >= 0xF0:
            need = 4
        elif byte >= 0xE0:
            need = 3
        elif byte >= 0xC0:
            need = 2
        else:
            return 0
        return back if back < need else 0
    return 0


def leading_continuations(data: bytes | bytearray) -> int:
    """Continuation bytes (at most 3) at the start of ``data``.

    >>> leading_continuations("😀".encode()[2:] + b"x")
    2
    """
    k = 0
    while k < 3 and k < len(data) and data[k] & 0xC0 == 0x80:
        k += 1
    return k


class Ring:
    """The newest ``capacity`` bytes written. Not thread-safe: callers lock."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.total = 0  # bytes ever written
        self._buf = bytearray()

    @property
    def start(self) -> int:
        """Offset of the oldest retained byte."""
        return self.total - len(self._buf)

    def write(self, data: bytes) -> None:
        n = len(data)
        cap = self.capacity
        if n >= cap:
            self._buf = bytearray(cap)
            self._put((self.total + n - cap) % cap, memoryview(data)[n - cap :])
            self.total += n
            return
        view = memoryview(data)
        if len(self._buf) < cap:  # still growing: index == offset
            room = cap - len(self._buf)
            if n <= room:
                self._buf += data
                self.total += n
                return
            self._buf += view[:room]
            self.total += room
            view = view[room:]
            n -= room
        self._put(self.total % cap, view)
        self.total += n

    def _put(self, pos: int, data: memoryview) -> None:
        first = min(len(data), self.capacity - pos)
        self._buf[pos : pos + first] = data[:first]
        if first < len(data):
            self._buf[: len(data) - first] = data[first:]

    def read(self, begin: int, end: int) -> bytes:
        """Bytes at offsets ``[begin, end)``, which must be retained."""
        if end <= begin:
            return b""
        pos = begin % self.capacity
        n = end - begin
        if pos + n <= len(self._buf):
            return bytes(self._buf[pos : pos + n])
        return bytes(self._buf[pos:]) + bytes(self._buf[: n - (len(self._buf) - pos)])

    def read_from(self, offset: int, *, closed: bool) -> tuple[bytes, int, int]:
        """``(data, next_offset, dropped)`` for a reader that has everything
        before ``offset``. ``closed``: the stream has ended, nothing is held back.
        """
        start, total = self.start, self.total
        if offset >= total:
            return b"", min(max(offset, 0), total), 0
        begin = max(offset, start)
        dropped = begin - offset if offset < start else 0
        if dropped and begin > 0:
            # The window starts mid-character: skip the orphaned continuation bytes.
            skip = leading_continuations(self.read(begin, min(begin + 3, total)))
            begin += skip
            dropped += skip
        end = total
        if not closed:
            end -= incomplete_tail(self.read(max(begin, total - 4), total))
        if end <= begin:
            return b"", begin, dropped
        return self.read(begin, end), end, dropped
