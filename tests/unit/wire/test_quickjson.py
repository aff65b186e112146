"""The quick path's JSON is the json package's, answers and errors alike."""

from __future__ import annotations

import doctest
import json
import math
from typing import Any

import pytest

from podbay.wire import quickjson
from podbay.wire.quickjson import dumps, loads


def outcome(call: Any, value: Any) -> tuple[str, Any]:
    try:
        result = call(value)
    except Exception as exc:  # noqa: BLE001 - the type and words are what must agree
        return type(exc).__name__, str(exc)
    if isinstance(result, float) and math.isnan(result):
        return "nan", None
    return "value", result


@pytest.mark.parametrize(
    "raw",
    [
        b'{"exit_code": 0, "stdout": "hi\\n", "stderr": "", "timed_out": false}',
        b' \r\n\t[1, -2.5e3, 1e400, "\\u00e9\\ud83d\\ude00", null, true, {}] \n',
        "\u00e9t\u00e9 \U0001f600".encode().join([b'"', b'"']),
        b"12345678901234567890123456789",
        b"NaN",
        b'"\\ud800"',  # a lone surrogate, escaped: json lets it in
        b"\xef\xbb\xbf{}",  # UTF-8 BOM: json.loads of bytes reads it
        '{"a": 1}'.encode("utf-16"),
        '{"a": 1}'.encode("utf-16-le"),
        '"x"'.encode("utf-32-be"),
        b"",
        b"   ",
        b"{} {}",
        b"[1,]",
        b'{"a" 1}',
        b'"open',
        b'"tab\there"',
        b"\xff\xfe\xfa",
        b'"\xed\xa0\x80"',  # an encoded surrogate: json's surrogatepass reads it
        b"nul",
        b"\x00\x00",
    ],
)
def test_loads_is_json_loads(raw: bytes) -> None:
    assert outcome(loads, raw) == outcome(json.loads, raw)


@pytest.mark.parametrize(
    "value",
    [
        {"command": ["sh", "-c", 'echo "$A" \\ \x01'], "cwd": "/tmp", "timeout_ms": 29000},
        {"env": {"K\u00e9": "\U0001f600", "": ""}, "user": "root"},
        ["\ud800", "\x7f", "</script>"],
        (1, True, False, None, -0, 2**70),
        {"class": "default"},
        {1: "int key", None: "none key"},
        [1.5, float("nan"), float("inf")],
        {"nested": [{"a": [[], {}]}]},
        {"bad": {1, 2}},
        {("tuple", "key"): 1},
        b"bytes",
    ],
)
def test_dumps_is_json_dumps(value: Any) -> None:
    assert outcome(dumps, value) == outcome(json.dumps, value)


def test_dumps_of_a_cycle_is_json_dumps_refusal() -> None:
    cycle: list[Any] = []
    cycle.append(cycle)
    assert outcome(dumps, cycle) == outcome(json.dumps, cycle)


def test_docstring_examples() -> None:
    assert doctest.testmod(quickjson).failed == 0
