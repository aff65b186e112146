"""Relay one HTTP request to an agent over its unix socket, streaming both ways.

Request bodies are read from ASGI ``receive`` as they arrive and response
bodies forwarded chunk by chunk, so a 1 GiB file passes in constant memory.
Hop-by-hop headers are dropped; the credential never reaches the agent.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import httpx

from podbay.errors import ApiError
from podbay.wire.codes import ErrorCode
from podbay.wire.paths import CREDENTIAL_HEADER, REQUEST_ID_HEADER

from .routes import Route

_HOP_BY_HOP = frozenset({
    b"connection", b"keep-alive", b"proxy-authenticate", b"proxy-authorization", b"te",
    b"trailers", b"transfer-encoding", b"upgrade", b"host", b"content-length",
    CREDENTIAL_HEADER.lower().encode(), REQUEST_ID_HEADER.lower().encode(),
})
_RESPONSE_DROP = frozenset({b"connection", b"keep-alive", b"transfer-encoding", b"date",
                            b"server"})


async def send_error(send, exc: ApiError, request_id: str) -> None:  # type: ignore[no-untyped-def]
    body = json.dumps(exc.body()).encode()
    await send({"type": "http.response.start", "status": exc.status, "headers": [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (REQUEST_ID_HEADER.lower().encode(), request_id.encode()),
    ]})
    await send({"type": "http.response.body", "body": body})


def _has_body(scope) -> bool:  # type: ignore[no-untyped-def]
    for key, value in scope["headers"]:
        if key == b"content-length":
            return value.strip() not in (b"", b"0")
        if key == b"transfer-encoding":
            return True
    return False


async def _request_body(receive) -> AsyncIterator[bytes]:  # type: ignore[no-untyped-def]
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ConnectionAbortedError("client went away")
        chunk = message.get("body", b"")
        if chunk:
            yield chunk
        if not message.get("more_body", False):
            return


async def relay(route: Route, scope, receive, send, tail: bytes,  # type: ignore[no-untyped-def]
                request_id: str) -> int:
    """Forward; returns the status sent to the client."""
    headers = [(k, v) for k, v in scope["headers"] if k not in _HOP_BY_HOP]
    headers.append((REQUEST_ID_HEADER.lower().encode(), request_id.encode()))
    content_length = next((v for k, v in scope["headers"] if k == b"content-length"), None)
    if content_length is not None:
        headers.append((b"content-length", content_length))
    body = _request_body(receive) if _has_body(scope) else None
    client = route.http()
    request = client.build_request(
        scope["method"], tail.decode("latin-1"), headers=headers, content=body,
    )
    try:
        response = await client.send(request, stream=True)
    except (httpx.TransportError, OSError, ConnectionAbortedError):
        exc = ApiError(ErrorCode.AGENT_UNREACHABLE, "the sandbox's agent did not answer")
        await send_error(send, exc, request_id)
        return exc.status
    try:
        out_headers = [(k.lower(), v) for k, v in response.headers.raw
                       if k.lower() not in _RESPONSE_DROP]
        out_headers.append((REQUEST_ID_HEADER.lower().encode(), request_id.encode()))
        await send({"type": "http.response.start", "status": response.status_code,
                    "headers": out_headers})
        try:
            async for chunk in response.aiter_raw():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except httpx.TransportError:
            pass  # the agent went away mid-body: end what we sent; the client sees a short body
        await send({"type": "http.response.body", "body": b"", "more_body": False})
    finally:
        await response.aclose()
    return response.status_code
