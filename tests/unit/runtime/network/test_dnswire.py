"""The DNS facts podbay's resolver reads from hostile bytes."""

from __future__ import annotations

import struct

import pytest

from podbay.runtime.network.dnswire import a_records, question, refusal


def query(name: str, ident: int = 0x1234) -> bytes:
    labels = b"".join(bytes([len(p)]) + p.encode() for p in name.split("."))
    return struct.pack("!HHHHHH", ident, 0x0100, 1, 0, 0, 0) + labels + b"\0" + b"\0\1\0\1"


def test_a_query_and_its_refusal() -> None:
    data = query("PyPI.org")
    asked = question(data)
    assert asked is not None
    assert asked.name == "pypi.org"
    assert asked.qtype == 1
    answer = refusal(data, asked)
    assert answer[:2] == data[:2]
    assert answer[3] & 0x0F == 5
    assert answer[2] & 0x80
    assert answer[12:] == data[12:]


def test_the_a_records_of_an_answer_with_a_pointer() -> None:
    data = bytearray(query("a.example"))
    data[2] |= 0x80  # a response
    data[7] = 2  # two answers
    data += b"\xc0\x0c" + struct.pack("!HHIH", 1, 1, 300, 4) + bytes([192, 0, 2, 7])
    data += b"\xc0\x0c" + struct.pack("!HHIH", 28, 1, 300, 16) + bytes(16)  # AAAA: not ours
    assert a_records(bytes(data)) == [("192.0.2.7", 300)]


@pytest.mark.parametrize(
    "data",
    [
        b"",
        b"\0" * 11,
        query("a.example")[:-3],  # cut
        struct.pack("!HHHHHH", 1, 0x0100, 1, 0, 0, 0) + b"\xc0\x0c\0\1\0\1",  # pointer loop
        struct.pack("!HHHHHH", 1, 0x8100, 1, 0, 0, 0) + b"\0\0\1\0\1",  # a response
        struct.pack("!HHHHHH", 1, 0x0100, 2, 0, 0, 0) + b"\0\0\1\0\1" * 2,  # two questions
        struct.pack("!HHHHHH", 1, 0x0100, 1, 0, 0, 0) + b"\x50abc",  # bad label length
    ],
)
def test_what_is_not_a_query_is_none(data: bytes) -> None:
    assert question(data) is None


def test_a_damaged_answer_gives_what_it_holds_whole() -> None:
    data = bytearray(query("a.example"))
    data[2] |= 0x80
    data[7] = 3  # claims three; holds one and a cut one
    data += b"\xc0\x0c" + struct.pack("!HHIH", 1, 1, 5, 4) + bytes([192, 0, 2, 8])
    data += b"\xc0\x0c" + struct.pack("!HHIH", 1, 1, 5, 4) + bytes([192, 0])
    assert a_records(bytes(data)) == [("192.0.2.8", 5)]
    assert a_records(query("a.example")) == []  # a query is no answer
