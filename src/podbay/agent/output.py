"""What an exec keeps of a stream: its head, its tail, or both, up to a cap.

Every byte is counted; ``dropped`` is exactly the bytes of the stream that
are not in the answer (for text, that includes the 1 to 3 bytes of a
character cut in two at a boundary, which are left out rather than turned
into a replacement character). ``head_tail`` keeps ``cap - cap // 2`` bytes
of head and ``cap // 2`` of tail; text gets a marker line between them,
base64 does not (the head's length is then ``len - cap // 2``).

>>> c = Capture(4, "head_tail")
>>> c.add(b"abcdefgh")
>>> c.render("utf-8")
('ab\\n[... 4 bytes dropped ...]\\ngh', 4)
"""

from __future__ import annotations

import base64

from .ring import incomplete_tail, leading_continuations

MARKER = "\n[... {} bytes dropped ...]\n"


class Capture:
    """One stream's kept output; the rest is counted, not kept."""

    __slots__ = ("cap", "head", "head_cap", "keep", "tail", "tail_cap", "total")

    def __init__(self, cap: int, keep: str = "head") -> None:
        self.cap = cap
        self.keep = keep
        self.head_cap = cap if keep == "head" else 0 if keep == "tail" else cap - cap // 2
        self.tail_cap = cap - self.head_cap
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    @property
    def truncated(self) -> bool:
        return self.total > self.cap

    def add(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.head_cap - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk and self.tail_cap:
            self.tail += chunk
            if len(self.tail) > 2 * self.tail_cap:  # trim now and then, not per chunk
                del self.tail[: len(self.tail) - self.tail_cap]

    def kept(self) -> tuple[bytes, bytes]:
        """(head, tail) as kept; tail is empty unless the stream overflowed the head."""
        tail = self.tail[max(0, len(self.tail) - self.tail_cap) :] if self.tail_cap else b""
        return bytes(self.head), bytes(tail)

    def render(self, encoding: str) -> tuple[str, int]:
        """The answer's text (UTF-8 or base64) and the bytes dropped."""
        head, tail = self.kept()
        dropped = self.total - len(head) - len(tail)
        if encoding == "base64":
            return base64.b64encode(head + tail).decode("ascii"), dropped
        if dropped:
            # Characters cut in two at the gap are left out whole, and counted.
            cut = incomplete_tail(head)
            head = head[: len(head) - cut]
            skip = leading_continuations(tail)
            tail = tail[skip:]
            dropped += cut + skip
        text = head.decode("utf-8", "replace")
        if dropped and self.keep == "head_tail":
            text += MARKER.format(dropped)
        return text + tail.decode("utf-8", "replace"), dropped
