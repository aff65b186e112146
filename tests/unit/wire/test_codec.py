"""The contract codec: strict for servers, lenient for clients, exact about types."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta, timezone

import pytest

from podbay.wire import codec
from podbay.wire.codec import WireError, decode, encode, format_time, loads, parse_time
from podbay.wire.control import AttachRequest, SandboxHandle, SandboxRecord
from podbay.wire.data import ExecRequest, ProcessOutput

NOW = datetime(2026, 11, 29, 12, 0, 0, 123000, tzinfo=UTC)


def test_times_are_rfc3339_utc_with_z() -> None:
    assert format_time(NOW) == "2026-11-29T12:00:00.123Z"
    assert parse_time("2026-11-29T13:00:00.123+01:00") == NOW
    assert parse_time("2026-11-29T12:00:00.123Z") == NOW
    with pytest.raises(ValueError, match="naive datetime"):
        format_time(datetime(2026, 1, 1))  # naive
    with pytest.raises(ValueError, match="time without an offset"):
        parse_time("2026-11-29T12:00:00")  # no offset
    assert format_time(NOW.astimezone(timezone(timedelta(hours=-5)))).endswith("Z")


def test_class_travels_under_its_wire_name() -> None:
    record = SandboxRecord(
        name="a", class_="default", state="running", created_at=NOW, last_active_at=NOW
    )
    data = encode(record)
    assert data["class"] == "default"
    assert "class_" not in data
    assert "ceiling_at" not in data  # absent, not null
    assert decode(SandboxRecord, data) == record
    assert decode(AttachRequest, {}) == AttachRequest(class_="default")
    assert decode(AttachRequest, {"class": "big"}).class_ == "big"


def test_strict_refuses_unknown_fields_lenient_ignores_them() -> None:
    data = {"command": ["ls"], "shell": True}
    with pytest.raises(WireError) as info:
        decode(ExecRequest, data)
    assert info.value.field == "shell"
    assert decode(ExecRequest, data, strict=False) == ExecRequest(command=["ls"])


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({}, "command"),
        ({"command": "ls"}, "command"),
        ({"command": ["ls", 1]}, "command[1]"),
        ({"command": ["ls"], "timeout_ms": True}, "timeout_ms"),
        ({"command": ["ls"], "timeout_ms": 1.5}, "timeout_ms"),
        ({"command": ["ls"], "env": {"A": 1}}, "env.A"),
        ({"command": ["ls"], "env": ["A=1"]}, "env"),
        ({"command": ["ls"], "cwd": None}, None),
    ],
)
def test_types_are_checked_and_faults_located(data: dict[str, object], field: str | None) -> None:
    if field is None:
        assert decode(ExecRequest, data).cwd is None
        return
    with pytest.raises(WireError) as info:
        decode(ExecRequest, data)
    assert info.value.field == field


def test_literals_and_nested_models() -> None:
    base = {"process_id": "p", "command": ["x"], "started_at": "2026-11-29T12:00:00Z"}
    with pytest.raises(WireError) as info:
        decode(ProcessOutput, {**base, "state": "zombie"})
    assert "running" in str(info.value)
    out = decode(ProcessOutput, {**base, "state": "exited", "exit_code": 3})
    assert out.exit_code == 3
    assert out.stdout == ""


def test_handle_round_trip_and_json_bytes() -> None:
    handle = SandboxHandle(
        name="t",
        class_="default",
        state="running",
        created_at=NOW,
        last_active_at=NOW,
        ceiling_at=NOW,
        endpoint="http://h/x",
        headers={"authorization": "Bearer x"},
        expires_at=NOW,
        start="created",
    )
    assert loads(SandboxHandle, codec.dumps(handle)) == handle


def test_loads_reports_bad_json_and_empty_body() -> None:
    with pytest.raises(WireError):
        loads(ExecRequest, b"{not json")
    with pytest.raises(WireError):
        loads(ExecRequest, b"\xff\xfe")
    assert loads(AttachRequest, b"") == AttachRequest()


@dataclass
class Inner:
    n: int


@dataclass
class Outer:
    inner: Inner | None = None
    items: list[Inner] = field(default_factory=list)


def test_optional_union_of_a_dataclass() -> None:
    assert decode(Outer, {"inner": {"n": 1}, "items": [{"n": 2}]}) == Outer(Inner(1), [Inner(2)])
    with pytest.raises(WireError) as info:
        decode(Outer, {"items": [{"n": "x"}]})
    assert info.value.field == "items[0].n"


@pytest.mark.parametrize("opening", [b"[", b'{"a":'])
def test_nesting_past_the_recursion_limit_is_a_wire_error(opening: bytes) -> None:
    """100,000 levels: every body parser of the control plane and the node
    (codec.parse_object, codec.loads) refuses it as a WireError (400 with a
    code at each route), never a RecursionError (a 500)."""
    closing = b"]" if opening == b"[" else b"}"
    deep = opening * 100_000 + b"1" + closing * 100_000
    for parse in (codec.parse_object, lambda raw: loads(AttachRequest, raw)):
        with pytest.raises(WireError, match="nested too deeply"):
            parse(deep)
    with pytest.raises(WireError, match="must be a JSON object"):
        codec.parse_object(b"[1]")
    assert codec.parse_object(b"") == {}
    assert codec.parse_object(b'{"a": [1]}') == {"a": [1]}
