"""The sandbox API's in-process calls to its own gateway (podbay.e2b.inprocess):
both directions stream, a closed answer is the gateway's ``http.disconnect``,
a failure before the answer is the caller's, and other URLs go over HTTP."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import httpx
import pytest

from podbay.asgi import Message, Receive, Scope, Send
from podbay.e2b.inprocess import InProcessTransport

pytestmark = pytest.mark.anyio

BASE = "http://127.0.0.1:8700"


class Gateway:
    """An ASGI app that echoes the request body's pieces, then streams until told."""

    def __init__(self) -> None:
        self.pieces: list[bytes] = []
        self.more = asyncio.Event()
        self.disconnected = asyncio.Event()
        self.scope: Scope = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.scope = scope
        if scope["path"] == "/boom":
            raise RuntimeError("boom")
        while True:
            message: Message = await receive()
            self.pieces.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        await send({"type": "http.response.start", "status": 201, "headers": [(b"x-a", b"1")]})
        await send({"type": "http.response.body", "body": b"first", "more_body": True})
        if scope["path"] == "/hold":
            await self.more.wait()
        await send({"type": "http.response.body", "body": b"last", "more_body": False})
        if scope["path"] == "/hold":
            return
        if (await receive())["type"] == "http.disconnect":
            self.disconnected.set()


def _client(gateway: Gateway, fallback: httpx.AsyncBaseTransport) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=InProcessTransport(BASE, gateway, fallback))


async def test_the_body_and_the_answer_stream_in_process() -> None:
    gateway = Gateway()

    async def body() -> AsyncIterator[bytes]:
        yield b"ab"
        yield b"cd"

    client = _client(gateway, httpx.MockTransport(lambda r: httpx.Response(599)))
    async with client, client.stream("PUT", BASE + "/hold/x?q=1", content=body()) as answer:
        assert (answer.status_code, answer.headers["x-a"]) == (201, "1")
        chunks = answer.aiter_bytes()
        # The first piece arrives while the gateway still holds the rest.
        assert await anext(chunks) == b"first"
        gateway.more.set()
        assert [c async for c in chunks] == [b"last"]
    assert b"".join(gateway.pieces) == b"abcd"
    assert (gateway.scope["path"], gateway.scope["query_string"]) == ("/hold/x", b"q=1")


async def test_a_closed_answer_is_the_gateways_disconnect() -> None:
    gateway = Gateway()
    async with _client(gateway, httpx.MockTransport(lambda r: httpx.Response(599))) as client:
        answer = await client.get(BASE + "/x")
        assert answer.content == b"firstlast"
    await asyncio.wait_for(gateway.disconnected.wait(), 10)


async def test_a_failure_before_the_answer_is_raised_to_the_caller() -> None:
    async with _client(Gateway(), httpx.MockTransport(lambda r: httpx.Response(599))) as client:
        with pytest.raises(RuntimeError, match="boom"):
            await client.get(BASE + "/boom")


async def test_other_urls_go_to_the_fallback() -> None:
    async with _client(Gateway(), httpx.MockTransport(lambda r: httpx.Response(204))) as client:
        assert (await client.get("http://10.0.0.1:8700/x")).status_code == 204
        assert (await client.get(BASE + "0/x")).status_code == 204  # :87000 is not ours
