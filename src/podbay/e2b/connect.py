"""The Connect protocol's framing, with its JSON codec: the codec E2B's SDKs
use for envd (their ``ENVD_JSON_CODEC``), so the messages are proto3 JSON
(camelCase fields, bytes as base64) and the server needs no protobuf code.

A streaming body is a sequence of envelopes: one flag byte, a 4-byte
big-endian length, the message. The last envelope of a response has flag
``0x02`` and a JSON trailer: ``{}`` or ``{"error": {"code", "message"}}``.
"""

from __future__ import annotations

import json
from typing import Any

from podbay.errors import ConnectError

__all__ = ["ConnectError"]

STREAM_JSON = "application/connect+json"
UNARY_JSON = "application/json"
FLAG_COMPRESSED = 0x01
FLAG_END = 0x02
#: Connect's codes and the HTTP status a unary error answers with.
STATUS = {
    "canceled": 499,
    "invalid_argument": 400,
    "deadline_exceeded": 504,
    "not_found": 404,
    "already_exists": 409,
    "failed_precondition": 400,
    "permission_denied": 403,
    "resource_exhausted": 429,
    "unimplemented": 501,
    "internal": 500,
    "unavailable": 503,
    "unauthenticated": 401,
}


def envelope(message: dict[str, Any], flags: int = 0) -> bytes:
    data = json.dumps(message, separators=(",", ":")).encode()
    return bytes([flags]) + len(data).to_bytes(4, "big") + data


def end_of_stream(error: ConnectError | None = None) -> bytes:
    return envelope({} if error is None else {"error": error.json()}, FLAG_END)


def parse_request(body: bytes, content_type: str) -> dict[str, Any]:
    """The one request message of a unary or server-streaming call."""
    media = content_type.split(";", 1)[0].strip().lower()
    if media == STREAM_JSON:
        if len(body) < 5:
            raise ConnectError("invalid_argument", "the request envelope is cut short")
        if body[0] & FLAG_COMPRESSED:
            raise ConnectError("unimplemented", "compressed requests are not supported")
        length = int.from_bytes(body[1:5], "big")
        if len(body) != 5 + length:
            raise ConnectError("invalid_argument", "the request envelope's length is wrong")
        data = body[5:]
    elif media == UNARY_JSON:
        data = body
    else:
        raise ConnectError("unimplemented", f"content type {media!r}: only JSON is served")
    try:
        message = json.loads(data or b"{}")
    except ValueError:
        raise ConnectError("invalid_argument", "the request message is not JSON") from None
    if not isinstance(message, dict):
        raise ConnectError("invalid_argument", "the request message must be a JSON object")
    return message


def timeout_ms(header: str | None) -> int | None:
    """``Connect-Timeout-Ms``: the call's deadline."""
    if header is None or not header.isdigit() or len(header) > 10:
        return None
    return int(header) or None
