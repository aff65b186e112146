"""The ASGI interface's types, spelled as Starlette's ``types.py`` spells them,
and the one way a plain ASGI callable refuses a request.

The gateway's relay and the control plane's middlewares are plain ASGI
callables; these aliases type them without importing Starlette, and are
the same types Starlette's own, so either side accepts the other's.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeAlias

if TYPE_CHECKING:
    from podbay.errors import ApiError

Scope: TypeAlias = MutableMapping[str, Any]
Message: TypeAlias = MutableMapping[str, Any]
Receive: TypeAlias = Callable[[], Awaitable[Message]]
Send: TypeAlias = Callable[[Message], Awaitable[None]]
ASGIApp: TypeAlias = Callable[[Scope, Receive, Send], Awaitable[None]]

#: ``scope["extensions"][BODY_TAKEOVER]``, set by podbay's listener on a request
#: that declares a large body: a callable that hands the rest of the body over
#: as the client's socket (:class:`TakenBody`), or returns None when it cannot.
#: The connection then closes after the answer (the server never parses the rest).
BODY_TAKEOVER = "podbay.body_takeover"
#: ``scope["extensions"][RESPONSE_GATHER]``, set by podbay's listener on every
#: request: a callable returning a context manager inside which the answer's
#: writes are gathered, and written to the client as one when it exits. For an
#: answer sent whole at once (its head and a small body): one write and one
#: segment instead of one per ASGI message, so the client wakes up once.
RESPONSE_GATHER = "podbay.response_gather"
#: ``scope["extensions"][RESPONSE_ABORT]``, set by podbay's listener on every
#: request: a callable that drops the client's connection at once, for an answer
#: already started that cannot be finished (its source's body was cut short):
#: ending it cleanly would hand the client a short body as if it were whole.
RESPONSE_ABORT = "podbay.response_abort"


def abort_response(scope: Scope) -> None:
    """Drop the client's connection mid-answer (see :data:`RESPONSE_ABORT`)."""
    abort = (scope.get("extensions") or {}).get(RESPONSE_ABORT)
    if abort is None:
        from podbay.errors import ResponseAborted  # here: this module loads none of podbay

        raise ResponseAborted("the answer was cut short")
    abort()


@dataclass
class TakenBody:
    """The rest of a request body, taken from the server to be moved by the kernel."""

    #: Body bytes the server had already read.
    head: bytes
    #: Bytes of body still unread on ``fd``.
    left: int
    #: The client's socket (non-blocking; the server reads nothing more from it).
    fd: int
    #: The longest the client may leave the body idle.
    idle_timeout: float
    #: Drops the client's connection (gone, or idle too long).
    abort: Callable[[], None]
    #: Tells the server the whole body has been read off ``fd``.
    finished: Callable[[], None]


async def send_refusal(
    send: Send, exc: ApiError, *headers: tuple[bytes, bytes], kind: str = "http"
) -> None:
    """Answer with ``exc``'s status and the contract's JSON body, plus ``headers``.
    ``kind="websocket.http"``: the same, as a WebSocket's denial response."""
    body = json.dumps(exc.body()).encode()
    if exc.retry_after is not None:
        headers = (*headers, (b"retry-after", f"{exc.retry_after:g}".encode()))
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
