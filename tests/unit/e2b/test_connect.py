"""Connect's envelope framing with the JSON codec (podbay.e2b.connect)."""

from __future__ import annotations

import json

import pytest

from podbay.e2b import connect


def test_envelope_is_flag_length_message() -> None:
    framed = connect.envelope({"event": {"start": {"pid": 7}}})
    assert framed[0] == 0
    assert int.from_bytes(framed[1:5], "big") == len(framed) - 5
    assert json.loads(framed[5:]) == {"event": {"start": {"pid": 7}}}


def test_end_of_stream_carries_the_error_as_trailer() -> None:
    end = connect.end_of_stream(connect.ConnectError("not_found", "gone"))
    assert end[0] == connect.FLAG_END
    assert json.loads(end[5:]) == {"error": {"code": "not_found", "message": "gone"}}
    assert json.loads(connect.end_of_stream()[5:]) == {}


def test_request_round_trip_streaming_and_unary() -> None:
    message = {"process": {"cmd": "/bin/bash"}}
    assert connect.parse_request(connect.envelope(message), "application/connect+json") == message
    assert connect.parse_request(json.dumps(message).encode(), "application/json") == message


@pytest.mark.parametrize(
    ("body", "content_type", "code"),
    [
        (b"\x00\x00", "application/connect+json", "invalid_argument"),
        (b"\x00\x00\x00\x00\x09{}", "application/connect+json", "invalid_argument"),
        (b"\x01\x00\x00\x00\x02{}", "application/connect+json", "unimplemented"),
        (b"\x00\x00\x00\x00\x01[", "application/connect+json", "invalid_argument"),
        (b"[1]", "application/json", "invalid_argument"),
        (b"{}", "application/proto", "unimplemented"),
    ],
)
def test_bad_requests_are_connect_errors(body: bytes, content_type: str, code: str) -> None:
    with pytest.raises(connect.ConnectError) as refused:
        connect.parse_request(body, content_type)
    assert refused.value.code == code


def test_timeout_header() -> None:
    assert connect.timeout_ms("60000") == 60000
    assert connect.timeout_ms("0") is None
    assert connect.timeout_ms("-1") is None
    assert connect.timeout_ms(None) is None
