"""``json.loads`` and ``json.dumps`` for the CLI's quick path, without importing
the ``json`` package.

``import json`` loads ``re``, ``enum``, ``functools`` and ``collections`` and
compiles six regular expressions: the largest share of the quick ``sandbox
exec``'s imports. The package's own C accelerator (``_json``) scans and
escapes without any of them, so these two give what ``json.loads`` and
``json.dumps`` give, answers and errors alike: whatever the fast way does not
take (a byte-order mark, UTF-16, a value that is not plain JSON data) goes to
the ``json`` package itself.

>>> loads(b' {"a": [1, 2.5, "\\\\u00e9", null, true]} ')
{'a': [1, 2.5, 'é', None, True]}
>>> dumps({"command": ["echo", "é"], "timeout_ms": 5})
'{"command": ["echo", "\\\\u00e9"], "timeout_ms": 5}'
"""

from __future__ import annotations

TYPE_CHECKING = False  # importing typing slows every CLI start; mypy reads this name
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

#: JSON's whitespace (RFC 8259): what ``json.loads`` skips around the value.
_SPACE = " \t\n\r"


class _ScanContext:
    """The settings ``json.JSONDecoder()`` hands its scanner: the defaults."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = {
        "NaN": float("nan"),
        "Infinity": float("inf"),
        "-Infinity": float("-inf"),
    }.__getitem__


_scan: Callable[[str, int], tuple[Any, int]] | None = None
_quote: Callable[[str], str] | None = None
try:
    import _json
except ImportError:  # pragma: no cover - an interpreter without the accelerator
    pass
else:
    _context: Any = _ScanContext()  # typeshed types this argument as a scanner
    _scan = _json.make_scanner(_context)
    _quote = _json.encode_basestring_ascii


def loads(raw: bytes) -> Any:
    """``json.loads(raw)``."""
    # A NUL in the first two bytes is how json.loads tells UTF-16 and UTF-32.
    if _scan is not None and 0 not in raw[:2]:
        try:
            text = raw.decode("utf-8")
            value, end = _scan(text, len(text) - len(text.lstrip(_SPACE)))
        except (UnicodeDecodeError, StopIteration):
            pass  # json.loads tells what is wrong (or reads UTF-16 and a BOM)
        else:
            if not text[end:].strip(_SPACE):
                return value
    import json

    return json.loads(raw)


def dumps(value: Any) -> str:
    """``json.dumps(value)``."""
    if _quote is not None:
        try:
            return _dump(value, _quote)
        # TypeError: not plain JSON data (json.dumps may still take it, or names
        # it); RecursionError: a cycle, which json.dumps names.
        except (TypeError, RecursionError):
            pass
    import json

    return json.dumps(value)


def _dump(value: Any, quote: Callable[[str], str]) -> str:
    # bool before int: True is an int. Exact types only: a subclass may format
    # itself differently, and json.dumps knows how.
    kind = type(value)
    if kind is str:
        return quote(value)
    if value is None:
        return "null"
    if kind is bool:
        return "true" if value else "false"
    if kind is int:
        return int.__repr__(value)
    if kind is list or kind is tuple:
        return "[" + ", ".join(_dump(item, quote) for item in value) + "]"
    if kind is dict and all(type(key) is str for key in value):
        return "{" + ", ".join(f"{quote(k)}: {_dump(v, quote)}" for k, v in value.items()) + "}"
    raise TypeError(kind)
