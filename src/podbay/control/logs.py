"""Structured logs: one JSON object per line, with the request id of the
request being served (``X-Request-Id``, taken from the caller or made up).

>>> import logging, io
>>> stream = io.StringIO()
>>> configure_logging("info", stream=stream)
>>> logging.getLogger("podbay.demo").info("hello", extra={"sandbox_id": "sb-1"})
>>> '"sandbox_id": "sb-1"' in stream.getvalue()
True
"""

from __future__ import annotations

import json
import logging
import sys
import uuid
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any, TextIO

from podbay.asgi import ASGIApp, Message, Receive, Scope, Send
from podbay.wire.paths import REQUEST_ID_HEADER

request_id: ContextVar[str | None] = ContextVar("podbay_request_id", default=None)
_RESERVED = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message",
    "asctime",
    "color_message",
}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC)
            .isoformat(timespec="milliseconds")
            .replace("+00:00", "Z"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        rid = request_id.get()
        if rid:
            out["request_id"] = rid
        for key, value in vars(record).items():
            if key not in _RESERVED and not key.startswith("_"):
                out[key] = (
                    value if isinstance(value, str | int | float | bool | None) else str(value)
                )
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out)


def configure_logging(level: str = "info", *, stream: TextIO | None = None) -> None:
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter())
    for name in ("podbay", "uvicorn", "uvicorn.error"):
        logger = logging.getLogger(name)
        logger.handlers[:] = [handler]
        logger.setLevel(level.upper())
        logger.propagate = False
    logging.getLogger("uvicorn.access").disabled = True


class RequestIdMiddleware:
    """Sets the request id for logs and echoes it in the response; logs each
    request with its status and duration."""

    _HEADER = REQUEST_ID_HEADER.lower().encode()

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.log = logging.getLogger("podbay.http")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        rid = (
            next((v.decode("latin-1") for k, v in scope["headers"] if k == self._HEADER), None)
            or uuid.uuid4().hex
        )
        token = request_id.set(rid)
        started = datetime.now(UTC)
        status = 0

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                message = {
                    **message,
                    "headers": [*message.get("headers", []), (self._HEADER, rid.encode())],
                }
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            ms = (datetime.now(UTC) - started).total_seconds() * 1000
            if scope["path"] not in ("/healthz", "/metrics"):
                self.log.info(
                    "%s %s %s",
                    scope["method"],
                    scope["path"],
                    status,
                    extra={
                        "status": status,
                        "duration_ms": round(ms, 2),
                        "method": scope["method"],
                        "path": scope["path"],
                    },
                )
            request_id.reset(token)
