"""Frames of the gateway-to-agent terminal stream (after ``Upgrade: podbay-pty``).

Why not WebSocket on this leg: the agent is stdlib-only, and the gateway
already terminates the client's WebSocket (credentials, limits), so the
leg between them needs only typed, length-prefixed frames: one kind byte,
a 4-byte big-endian length, the payload. Every frame is at most
:data:`MAX_FRAME` bytes of payload; a longer one, or an unknown kind, is a
protocol fault and ends the session (either side may be hostile: code in
the sandbox can answer on the agent's socket).

Kinds::

    gateway → agent   DATA (terminal input)   RESIZE (rows, cols: two u16)
    agent → gateway   DATA (terminal output)  EXIT (exit code: i32)
"""

from __future__ import annotations

import struct

from podbay.errors import FrameError as FrameError  # re-exported: defined in the one tree

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Final

DATA: Final = b"d"
RESIZE: Final = b"r"
EXIT: Final = b"x"
KINDS: Final = frozenset({DATA, RESIZE, EXIT})
#: Largest payload of one frame (terminal bytes are cut into frames this big).
MAX_FRAME: Final = 64 * 1024
HEADER: Final = struct.Struct(">cI")
#: Terminal sizes accepted (rows and cols each).
MAX_DIMENSION: Final = 10_000


def frame(kind: bytes, payload: bytes = b"") -> bytes:
    """One frame.

    >>> frame(DATA, b"hi")
    b'd\\x00\\x00\\x00\\x02hi'
    """
    if len(payload) > MAX_FRAME:
        raise FrameError(f"frame payload of {len(payload)} bytes is over {MAX_FRAME}")
    return HEADER.pack(kind, len(payload)) + payload


def data_frames(data: bytes) -> list[bytes]:
    """``data`` as DATA frames of at most :data:`MAX_FRAME` bytes each."""
    return [frame(DATA, data[i : i + MAX_FRAME]) for i in range(0, len(data), MAX_FRAME)]


def resize_frame(rows: int, cols: int) -> bytes:
    check_size(rows, cols)
    return frame(RESIZE, struct.pack(">HH", rows, cols))


def exit_frame(code: int) -> bytes:
    return frame(EXIT, struct.pack(">i", code))


def check_size(rows: int, cols: int) -> None:
    for name, value in (("rows", rows), ("cols", cols)):
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_DIMENSION:
            raise FrameError(f"{name} must be an integer from 1 to {MAX_DIMENSION}")


def parse_header(head: bytes) -> tuple[bytes, int]:
    """Kind and payload length of a frame header; :class:`FrameError` when bad."""
    kind, length = HEADER.unpack(head)
    if kind not in KINDS:
        raise FrameError(f"unknown frame kind {kind!r}")
    if length > MAX_FRAME:
        raise FrameError(f"frame of {length} bytes is over {MAX_FRAME}")
    return kind, length


def parse_resize(payload: bytes) -> tuple[int, int]:
    if len(payload) != 4:
        raise FrameError("a resize frame holds two 16-bit numbers")
    rows, cols = struct.unpack(">HH", payload)
    check_size(rows, cols)
    return rows, cols


def parse_exit(payload: bytes) -> int:
    if len(payload) != 4:
        raise FrameError("an exit frame holds one 32-bit number")
    code: int = struct.unpack(">i", payload)[0]
    return code
