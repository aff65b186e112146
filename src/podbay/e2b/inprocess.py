"""The sandbox API's calls to this process's own gateway, handed to it in
process (``podbay serve``: the gateway is the same process as the sandbox API).

Over loopback HTTP every byte of a command's output, a file or a cell crossed
this process twice more (sent by its client, parsed by its listener) on the
same event loop; handed over as ASGI messages, the gateway gets them as the
console's ``LocalDataPlane`` hands it the console's requests. Both directions
stream: the request body as the gateway reads it, the answer as the gateway
writes it (a queue of at most :data:`QUEUED_CHUNKS` pieces, so a slow reader
slows the gateway, not this process's memory). Closing the answer (a client
that went away) tells the gateway ``http.disconnect`` and cancels it, as a
dropped connection would. Any other URL goes over HTTP as before.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from urllib.parse import unquote

import httpx

from podbay.asgi import ASGIApp, Message

#: Pieces of an answer held between the gateway and the reader.
QUEUED_CHUNKS = 16
_END = object()
#: Gateway tasks still finishing after their answer was read whole.
_AFTER: set[asyncio.Task[None]] = set()


class InProcessTransport(httpx.AsyncBaseTransport):
    """Requests under ``base_url`` go to ``app`` in process; others to ``fallback``."""

    def __init__(self, base_url: str, app: ASGIApp, fallback: httpx.AsyncBaseTransport) -> None:
        self.prefix = base_url.rstrip("/") + "/"
        self.app = app
        self.fallback = fallback

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if not str(request.url).startswith(self.prefix):
            return await self.fallback.handle_async_request(request)
        return await _Exchange(self.app, request).start()

    async def aclose(self) -> None:
        await self.fallback.aclose()


class _Exchange(httpx.AsyncByteStream):
    """One request handed to the app, and its answer's body as a stream."""

    def __init__(self, app: ASGIApp, request: httpx.Request) -> None:
        self.app = app
        self.request = request
        self.head: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        self.chunks: asyncio.Queue[object] = asyncio.Queue(QUEUED_CHUNKS)
        self.gone = asyncio.Event()
        self.body: AsyncIterator[bytes] | None = self._request_body()
        self.task: asyncio.Task[None] | None = None
        #: The whole answer was read: what the gateway does after it is left to run.
        self.finished = False

    async def _request_body(self) -> AsyncIterator[bytes]:
        stream = self.request.stream
        assert isinstance(stream, httpx.AsyncByteStream)
        async for chunk in stream:
            if chunk:
                yield chunk

    def _scope(self) -> dict[str, object]:
        url = self.request.url
        return {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": self.request.method,
            "scheme": url.scheme,
            "path": unquote(url.path),
            "raw_path": url.raw_path.split(b"?", 1)[0],
            "query_string": url.query,
            "root_path": "",
            "headers": [(k.lower(), v) for k, v in self.request.headers.raw],
            "client": ("127.0.0.1", 0),
            "server": (url.host, url.port),
            "extensions": {},
        }

    async def _receive(self) -> Message:
        if self.body is not None:
            chunk = await anext(self.body, None)
            if chunk is not None:
                return {"type": "http.request", "body": chunk, "more_body": True}
            self.body = None
            return {"type": "http.request", "body": b"", "more_body": False}
        await self.gone.wait()
        return {"type": "http.disconnect"}

    async def _send(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.head.set_result(message)
        elif message["type"] == "http.response.body":
            if body := message.get("body", b""):
                await self.chunks.put(bytes(body))
            if not message.get("more_body", False):
                await self.chunks.put(_END)

    async def _run(self) -> None:
        try:
            await self.app(self._scope(), self._receive, self._send)
        except Exception as exc:  # noqa: BLE001 - handed on: the caller raises it
            if not self.head.done():
                self.head.set_exception(exc)
            else:
                await self.chunks.put(exc)
        else:
            if not self.head.done():
                self.head.set_exception(httpx.RemoteProtocolError("the gateway sent no answer"))
            await self.chunks.put(_END)  # an answer it never finished ends here

    async def start(self) -> httpx.Response:
        self.task = asyncio.get_running_loop().create_task(self._run())
        try:
            head = await self.head
        except BaseException:
            await self.aclose()
            raise
        return httpx.Response(
            head["status"], headers=head.get("headers", []), stream=self, request=self.request
        )

    async def __aiter__(self) -> AsyncIterator[bytes]:
        while True:
            item = await self.chunks.get()
            if item is _END:
                self.finished = True
                return
            if isinstance(item, BaseException):
                raise httpx.ReadError(f"the gateway's answer was cut short: {item}") from item
            assert isinstance(item, bytes)
            yield item

    async def aclose(self) -> None:
        self.gone.set()
        if self.task is None or self.task.done():
            return
        if self.finished:
            _AFTER.add(self.task)  # kept until done: the loop holds tasks weakly
            self.task.add_done_callback(_AFTER.discard)
        else:
            self.task.cancel()
            await asyncio.wait({self.task})  # its own end; a cancel of ours still raises
