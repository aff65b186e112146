"""The wire contract: models, refusal codes, limits and paths.

The one home of everything client and servers must agree on. Stdlib only
and free of I/O, because the agent imports it inside the sandbox with the
image's bare interpreter.

The names below are loaded on first use, so that importing one small
submodule (``paths``, ``limits``) does not load the codec and the models:
the CLI's quick exec path needs only the paths.
"""

from __future__ import annotations

from ._lazy import lazy_getattr

TYPE_CHECKING = False  # importing typing slows every CLI start; mypy reads this name

# A name → module table like podbay.client's, on purpose: each package loads
# its own names lazily (one shared table would make either import the other).
_EXPORTS: dict[str, str] = {
    "WireError": ".codec",
    "decode": ".codec",
    "dumps": ".codec",
    "encode": ".codec",
    "format_time": ".codec",
    "loads": ".codec",
    "parse_time": ".codec",
    "NOT_ENABLED_CODES": ".codes",
    "STATUS": ".codes",
    "ErrorCode": ".codes",
    "error_body": ".codes",
}

__all__ = [
    "NOT_ENABLED_CODES",
    "STATUS",
    "ErrorCode",
    "WireError",
    "decode",
    "dumps",
    "encode",
    "error_body",
    "format_time",
    "loads",
    "parse_time",
]

if TYPE_CHECKING:  # pragma: no cover
    from .codec import WireError, decode, dumps, encode, format_time, loads, parse_time
    from .codes import NOT_ENABLED_CODES, STATUS, ErrorCode, error_body


__getattr__ = lazy_getattr(__name__, _EXPORTS)
