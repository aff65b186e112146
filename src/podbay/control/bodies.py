"""Request bodies the control plane reads are bounded, by declared length
and while they stream.

The control plane's bodies are small JSON (attach's is a few bytes), so a
body over :data:`~podbay.wire.limits.MAX_CONTROL_BODY` is refused with 413
``REQUEST_TOO_LARGE``: at once when ``Content-Length`` says so, else as
soon as the streamed bytes pass the limit. Nothing is buffered beyond it.
A volume file's content (``PUT /api/v1/volumes/{name}/files``) is the one
larger body: :data:`VOLUME_FILE_BODY`.
"""

from __future__ import annotations

from podbay.asgi import ASGIApp, Message, Receive, Scope, Send, send_refusal
from podbay.errors import ApiError
from podbay.wire.codes import ErrorCode
from podbay.wire.paths import VOLUMES

#: A file written into a volume through the API (larger: write it in a sandbox).
VOLUME_FILE_BODY = 64 << 20


def limit_for(path: str, limit: int) -> int:
    """The body limit of a request to ``path``."""
    if path.startswith(VOLUMES + "/") and path.endswith("/files"):
        return max(limit, VOLUME_FILE_BODY)
    return limit


class BodyLimit:
    """Pure ASGI middleware: ``BodyLimit(app, limit)``."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = limit_for(scope.get("path", ""), self.limit)
        declared = _content_length(scope)
        if declared is not None and declared > limit:
            await _refuse(send, self._refusal(limit))
            return
        received = 0

        async def bounded_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise self._refusal(limit)
            return message

        await self.app(scope, bounded_receive, send)

    def _refusal(self, limit: int) -> ApiError:
        return ApiError(ErrorCode.REQUEST_TOO_LARGE, f"the request body is over {limit} bytes")


def _content_length(scope: Scope) -> int | None:
    for key, value in scope["headers"]:
        if key == b"content-length":
            text = value.strip()
            return int(text) if text.isdigit() else None
    return None


async def _refuse(send: Send, exc: ApiError) -> None:
    await send_refusal(send, exc, (b"connection", b"close"))
