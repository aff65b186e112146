"""Turn contract dataclasses into JSON-ready dicts and back, with checks.

Stdlib only, because the agent imports it inside the sandbox with the
image's bare interpreter. Servers decode with ``strict=True`` (an unknown
field is refused: a silently ignored option is a bug); clients decode with
``strict=False`` (an old SDK must survive a newer server).

A field whose wire name differs from its Python name (``class``) carries
``metadata={"wire": "class"}``.

>>> from dataclasses import dataclass
>>> @dataclass
... class Point:
...     x: int
...     label: str | None = None
>>> decode(Point, {"x": 1})
Point(x=1, label=None)
>>> encode(Point(2, "a"))
{'x': 2, 'label': 'a'}
"""

from __future__ import annotations

import dataclasses
import json
import re
import types
import typing
from datetime import UTC, datetime
from enum import Enum
from functools import cache
from typing import Any, Literal, TypeVar, Union, get_args, get_origin

from podbay.errors import WireError as WireError  # re-exported: defined in the one tree

T = TypeVar("T")
#: UTF-16 halves on their own: JSON's ``\\ud800`` escapes let them into a
#: ``str``, but they name no character, cannot be encoded, and no path, env
#: name or argument can hold one.
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def format_time(value: datetime) -> str:
    """RFC 3339 in UTC with a ``Z``, millisecond precision."""
    if value.tzinfo is None:
        raise ValueError("naive datetime on the wire")
    return value.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def parse_time(text: str) -> datetime:
    """Parse RFC 3339 (``Z`` or an offset); the result is aware, in UTC."""
    parsed = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    if parsed.tzinfo is None:
        raise ValueError("time without an offset")
    return parsed.astimezone(UTC)


@cache
def _fields(cls: type) -> tuple[tuple[str, str, Any, bool], ...]:
    """(python name, wire name, resolved type, required) for each field."""
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        out.append((f.name, f.metadata.get("wire", f.name), hints[f.name], required))
    return tuple(out)


def encode(obj: Any) -> Any:
    """A dataclass (or list, dict, scalar) as JSON-ready values.

    ``None`` fields are left out: the contract says "absent", not ``null``.
    """
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        out: dict[str, Any] = {}
        for name, wire, _, _ in _fields(type(obj)):
            value = getattr(obj, name)
            if value is not None:
                out[wire] = encode(value)
        return out
    if isinstance(obj, datetime):
        return format_time(obj)
    if isinstance(obj, Enum):
        return obj.value
    if isinstance(obj, list | tuple):
        return [encode(v) for v in obj]
    if isinstance(obj, dict):
        return {k: encode(v) for k, v in obj.items()}
    return obj


def dumps(obj: Any) -> bytes:
    """Compact UTF-8 JSON of :func:`encode`.

    A lone surrogate (say, echoed back in a refusal's message) is written as
    a ``\\udXXX`` escape: the answer stays valid JSON instead of failing.
    """
    data = encode(obj)
    try:
        return json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode()
    except UnicodeEncodeError:
        return json.dumps(data, separators=(",", ":")).encode()


def decode(cls: type[T], data: Any, *, strict: bool = True, where: str = "") -> T:
    """Build ``cls`` from parsed JSON, checking every type on the way.

    Raises :class:`WireError` naming the first field that does not fit.
    """
    return typing.cast(T, _convert(cls, data, strict, where))


def parse(raw: bytes | str) -> Any:
    """JSON text as Python values (``{}`` for nothing); :class:`WireError` when
    it is not JSON or nests past the interpreter's recursion limit (a hostile
    ``[[[[...`` of 100,000 levels is a refusal, not a ``RecursionError``)."""
    try:
        return json.loads(raw) if raw else {}
    except (ValueError, UnicodeDecodeError) as exc:
        raise WireError("", f"body is not valid JSON ({exc})") from None
    except RecursionError:
        raise WireError("", "body is nested too deeply") from None


def parse_object(raw: bytes | str) -> dict[str, Any]:
    """:func:`parse` for a body that must be a JSON object."""
    doc = parse(raw)
    if not isinstance(doc, dict):
        raise WireError("", "the body must be a JSON object")
    return doc


def loads(cls: type[T], raw: bytes | str, *, strict: bool = True) -> T:
    """Parse JSON text and :func:`decode` it."""
    data = parse(raw)
    try:
        return decode(cls, data, strict=strict)
    except RecursionError:  # nesting json.loads took but decoding, a frame deeper each level, not
        raise WireError("", "body is nested too deeply") from None


def _join(where: str, key: str | int) -> str:
    if isinstance(key, int):
        return f"{where}[{key}]"
    return f"{where}.{key}" if where else key


def _describe(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp)


def _convert(tp: Any, value: Any, strict: bool, where: str) -> Any:
    origin = get_origin(tp)
    if tp is Any:
        return value
    if origin in (Union, types.UnionType):
        args = get_args(tp)
        if value is None:
            if type(None) in args:
                return None
            raise WireError(where, "must not be null")
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _convert(arg, value, strict, where)
            except WireError:
                if len([a for a in args if a is not type(None)]) == 1:
                    raise
        raise WireError(where, f"does not fit {tp}")
    if origin is Literal:
        if value not in get_args(tp):
            allowed = ", ".join(repr(a) for a in get_args(tp))
            raise WireError(where, f"must be one of {allowed}")
        return value
    if origin is list:
        if not isinstance(value, list):
            raise WireError(where, "must be a list")
        (item,) = get_args(tp)
        return [_convert(item, v, strict, _join(where, i)) for i, v in enumerate(value)]
    if origin is dict:
        if not isinstance(value, dict):
            raise WireError(where, "must be an object")
        key_type, item = get_args(tp)
        return {
            _convert(key_type, k, strict, _join(where, "<key>")): _convert(
                item, v, strict, _join(where, k)
            )
            for k, v in value.items()
        }
    if dataclasses.is_dataclass(tp):
        return _convert_dataclass(tp, value, strict, where)
    if isinstance(tp, type) and issubclass(tp, Enum):
        try:
            return tp(value)
        except ValueError:
            allowed = ", ".join(repr(m.value) for m in tp)
            raise WireError(where, f"must be one of {allowed}") from None
    if tp is datetime:
        if not isinstance(value, str):
            raise WireError(where, "must be an RFC 3339 time")
        try:
            return parse_time(value)
        except ValueError:
            raise WireError(where, "must be an RFC 3339 time") from None
    if tp is bool:
        if not isinstance(value, bool):
            raise WireError(where, "must be true or false")
        return value
    if tp is int:
        # bool is an int in Python, never on the wire.
        if isinstance(value, bool) or not isinstance(value, int):
            raise WireError(where, "must be an integer")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise WireError(where, "must be a number")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise WireError(where, "must be a string")
        if not value.isascii() and _LONE_SURROGATE.search(value):
            raise WireError(where, "must be valid Unicode (it holds a lone surrogate)")
        return value
    raise TypeError(f"codec cannot handle {_describe(tp)} at {where or 'top level'}")


def _convert_dataclass(cls: Any, value: Any, strict: bool, where: str) -> Any:
    if not isinstance(value, dict):
        raise WireError(where, "must be an object")
    fields = _fields(cls)
    known = {wire for _, wire, _, _ in fields}
    if strict:
        for key in value:
            if key not in known:
                raise WireError(_join(where, key), "unknown field")
    kwargs: dict[str, Any] = {}
    for name, wire, tp, required in fields:
        if wire in value:
            kwargs[name] = _convert(tp, value[wire], strict, _join(where, wire))
        elif required:
            raise WireError(_join(where, wire), "is required")
    return cls(**kwargs)
