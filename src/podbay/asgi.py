"""The ASGI interface's types, spelled as Starlette's ``types.py`` spells them,
and the one way a plain ASGI callable refuses a request.

The gateway's relay and the control plane's middlewares are plain ASGI
callables; these aliases type them without importing Starlette, and are
the same types Starlette's own, so either side accepts the other's.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import TYPE_CHECKING, Any, TypeAlias

if TYPE_CHECKING:
    from podbay.errors import ApiError

Scope: TypeAlias = MutableMapping[str, Any]
Message: TypeAlias = MutableMapping[str, Any]
Receive: TypeAlias = Callable[[], Awaitable[Message]]
Send: TypeAlias = Callable[[Message], Awaitable[None]]
ASGIApp: TypeAlias = Callable[[Scope, Receive, Send], Awaitable[None]]


async def send_refusal(
    send: Send, exc: ApiError, *headers: tuple[bytes, bytes], kind: str = "http"
) -> None:
    """Answer with ``exc``'s status and the contract's JSON body, plus ``headers``.
    ``kind="websocket.http"``: the same, as a WebSocket's denial response."""
    body = json.dumps(exc.body()).encode()
    await send(
        {
            "type": f"{kind}.response.start",
            "status": exc.status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                *headers,
            ],
        }
    )
    await send({"type": f"{kind}.response.body", "body": body})
