"""The wire contract: models, refusal codes, limits and paths.

The one home of everything client and servers must agree on. Stdlib only
and free of I/O, because the agent imports it inside the sandbox with the
image's bare interpreter.
"""

from .codec import WireError, decode, dumps, encode, format_time, loads, parse_time
from .codes import NOT_ENABLED_CODES, STATUS, ErrorCode, error_body

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
