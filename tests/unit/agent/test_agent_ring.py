from __future__ import annotations

import pytest

from podbay.agent.ring import Ring, incomplete_tail, leading_continuations


def _write_all(ring: Ring, data: bytes, step: int) -> None:
    for i in range(0, len(data), step):
        ring.write(data[i : i + step])


@pytest.mark.parametrize("step", [1, 3, 7, 10, 16, 25])
def test_keeps_the_newest_bytes_whatever_the_write_sizes(step: int) -> None:
    data = bytes(range(256)) * 3
    ring = Ring(10)
    _write_all(ring, data, step)
    assert ring.total == len(data)
    assert ring.start == len(data) - 10
    out, nxt, dropped = ring.read_from(0, closed=True)
    assert out == data[-10:]
    assert nxt == len(data)
    assert dropped == len(data) - 10


def test_reads_every_window_position() -> None:
    data = bytes(range(100))
    ring = Ring(16)
    _write_all(ring, data, 5)
    for begin in range(ring.start, 100):
        for end in range(begin, 101):
            assert ring.read(begin, end) == data[begin:end]


def test_offsets_before_during_and_after_the_window() -> None:
    ring = Ring(8)
    ring.write(b"0123456789abcdef")
    assert ring.read_from(4, closed=True) == (b"89abcdef", 16, 4)
    assert ring.read_from(12, closed=True) == (b"cdef", 16, 0)
    assert ring.read_from(16, closed=True) == (b"", 16, 0)
    assert ring.read_from(99, closed=True) == (b"", 16, 0)


def test_growing_buffer_before_it_is_full() -> None:
    ring = Ring(1024)
    ring.write(b"abc")
    ring.write(b"def")
    assert ring.read_from(0, closed=False) == (b"abcdef", 6, 0)
    assert ring.read_from(2, closed=False) == (b"cdef", 6, 0)


def test_incomplete_trailing_character_waits_while_open() -> None:
    smile = "\U0001f600".encode()
    ring = Ring(64)
    ring.write(b"a" + smile[:2])
    assert ring.read_from(0, closed=False) == (b"a", 1, 0)
    ring.write(smile[2:3])
    assert ring.read_from(1, closed=False) == (b"", 1, 0)
    ring.write(smile[3:])
    assert ring.read_from(1, closed=False) == (smile, 5, 0)
    # Once the stream ended nothing is held back (the decoder replaces it).
    ring.write(smile[:1])
    assert ring.read_from(5, closed=True) == (smile[:1], 6, 0)


def test_window_starting_mid_character_counts_the_rest_as_dropped() -> None:
    e_acute = "\u00e9".encode()  # 2 bytes
    ring = Ring(5)
    ring.write(b"x" + e_acute * 3)  # 7 bytes: window keeps the last 5, starting mid-char
    out, nxt, dropped = ring.read_from(0, closed=True)
    assert out == e_acute * 2
    assert nxt == 7
    assert dropped == 3
    assert out.decode() == "\u00e9\u00e9"


def test_huge_single_write() -> None:
    ring = Ring(4)
    ring.write(b"ab")
    ring.write(b"0123456789")
    assert ring.read_from(0, closed=True) == (b"6789", 12, 8)
    ring.write(b"XY")
    assert ring.read_from(10, closed=True) == (b"89XY", 14, 0)


def test_utf8_helpers() -> None:
    assert incomplete_tail(b"") == 0
    assert incomplete_tail(b"\x80\x80\x80\x80") == 0  # no lead byte: not ours to hold
    assert incomplete_tail("\u20ac".encode()[:2]) == 2
    assert incomplete_tail(b"a\xff") == 0
    assert leading_continuations(b"\x80\x80\x80\x80") == 3
    assert leading_continuations(b"abc") == 0
