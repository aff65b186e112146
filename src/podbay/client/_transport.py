"""The blocking client's default transport: HTTP/1.1 on the standard library.

Why not httpx's own (httpcore and h11): an SDK ``exec`` is a small JSON
request and answer, and the client's CPU per call is a large part of its
round trip, and ``httpx.HTTPTransport`` spends about twice the client CPU
per exec that ``http.client`` does (``bench/sdk.py``; docs/performance.md). This
transport keeps httpx's face (requests and responses, timeouts, its
exception classes, streaming both ways) and moves the bytes with
``http.client``: the head and a small body leave in one ``send``, and the
answer's head is parsed in C.

Connections are kept alive per origin (at most ``max_idle`` idle ones each)
and checked before reuse: one the server closed while idle is dropped, never
written to, so a request is never lost to a stale connection (a transport
failure is never retried: the command may have run). The TLS context is
httpx's default one (the same trust store).
"""

from __future__ import annotations

import http.client
import select
import ssl
import threading
from collections.abc import Iterator
from typing import Any

import httpx

#: How much of an answer's body one read takes at most.
READ_SIZE = 64 * 1024

_Origin = tuple[str, str, int]


class _Corked:
    """An ``http.client`` connection whose :meth:`send` can gather what it is
    given into one write: http.client sends a request's head and its body
    separately, and two writes are two segments (and two wake-ups) for a
    small JSON request."""

    _gathered: bytearray | None = None

    def send(self, data: Any) -> None:
        if self._gathered is not None and isinstance(data, bytes | bytearray):
            self._gathered += data
            return
        super().send(data)  # type: ignore[misc]

    def send_whole(self, send: Any) -> None:
        """Run ``send`` (which calls :meth:`send`), then write what it gave at once."""
        self._gathered = bytearray()
        try:
            send()
            data = bytes(self._gathered)
        finally:
            self._gathered = None
        self.send(data)


class _Connection(_Corked, http.client.HTTPConnection):
    pass


class _TLSConnection(_Corked, http.client.HTTPSConnection):
    pass


_Conn = _Connection | _TLSConnection


class StdlibTransport(httpx.BaseTransport):
    """An ``httpx.BaseTransport`` over ``http.client``, keeping connections alive.

    >>> client = httpx.Client(transport=StdlibTransport())  # doctest: +SKIP
    """

    def __init__(self, *, max_idle: int = 16, verify: ssl.SSLContext | None = None) -> None:
        self.max_idle = max_idle
        self._verify = verify
        self._lock = threading.Lock()
        self._idle: dict[_Origin, list[_Conn]] = {}
        self._closed = False

    # -- connections ---------------------------------------------------------------
    def _context(self) -> ssl.SSLContext:
        if self._verify is None:
            self._verify = httpx.create_ssl_context()
        return self._verify

    def _acquire(self, origin: _Origin, connect_timeout: float | None) -> _Conn:
        while True:
            with self._lock:
                idle = self._idle.get(origin)
                conn = idle.pop() if idle else None
            if conn is None:
                break
            if _usable(conn):
                return conn
            conn.close()
        scheme, host, port = origin
        if scheme == "https":
            return _TLSConnection(host, port, timeout=connect_timeout, context=self._context())
        return _Connection(host, port, timeout=connect_timeout)

    def _release(self, origin: _Origin, conn: _Conn) -> None:
        with self._lock:
            idle = self._idle.setdefault(origin, [])
            if not self._closed and len(idle) < self.max_idle:
                idle.append(conn)
                return
        conn.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, {}
        for conns in idle.values():
            for conn in conns:
                conn.close()

    # -- one request ---------------------------------------------------------------
    def handle_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        if url.scheme not in ("http", "https"):
            raise httpx.UnsupportedProtocol(f"unsupported scheme {url.scheme!r}", request=request)
        origin = (url.scheme, url.host, url.port or (443 if url.scheme == "https" else 80))
        timeouts: dict[str, float | None] = request.extensions.get("timeout", {})
        conn = self._acquire(origin, timeouts.get("connect"))
        if conn.sock is None:
            with _translated(request, httpx.ConnectError, httpx.ConnectTimeout):
                conn.connect()
        assert conn.sock is not None
        try:
            conn.sock.settimeout(timeouts.get("write"))
            with _translated(request, httpx.WriteError, httpx.WriteTimeout):
                _send(conn, request)
            conn.sock.settimeout(timeouts.get("read"))
            with _translated(request, httpx.ReadError, httpx.ReadTimeout):
                answer = conn.getresponse()
        except BaseException:
            conn.close()
            raise
        return httpx.Response(
            answer.status,
            # http.client decodes header bytes as latin-1: encoded back, unchanged.
            headers=[(k.encode("latin-1"), v.encode("latin-1")) for k, v in answer.getheaders()],
            stream=_Body(self, origin, conn, answer, request),
            extensions={"http_version": b"HTTP/1.1", "reason_phrase": answer.reason.encode()},
        )


def _send(conn: _Conn, request: httpx.Request) -> None:
    """The head and the body; a body already in memory leaves with the head."""
    conn.putrequest(
        request.method,
        request.url.raw_path.decode("ascii"),
        skip_host=True,
        skip_accept_encoding=True,
    )
    chunked = False
    for name, value in request.headers.raw:
        conn.putheader(name, value)
        chunked = chunked or (name.lower() == b"transfer-encoding" and value.lower() == b"chunked")
    if isinstance(request.stream, httpx.ByteStream):
        body = request.content or None
        conn.send_whole(lambda: conn.endheaders(body))
    else:
        conn.endheaders(iter(request.stream), encode_chunked=chunked)  # type: ignore[arg-type]


class _Body(httpx.SyncByteStream):
    """An answer's body as it is read; the connection goes back to the pool once
    the body was read to its end (and the server keeps it open)."""

    def __init__(
        self,
        transport: StdlibTransport,
        origin: _Origin,
        conn: _Conn,
        answer: http.client.HTTPResponse,
        request: httpx.Request,
    ) -> None:
        self._transport = transport
        self._origin = origin
        self._conn: _Conn | None = conn
        self._answer = answer
        self._request = request

    def __iter__(self) -> Iterator[bytes]:
        with _translated(self._request, httpx.ReadError, httpx.ReadTimeout):
            while chunk := self._answer.read1(READ_SIZE):
                yield chunk

    def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None:
            return
        answer = self._answer
        # A length-framed body read to its end leaves the answer open (http.client
        # closes it on the next read): read whole either way.
        finished = answer.isclosed() or (not answer.chunked and answer.length == 0)
        answer.close()
        if finished and not answer.will_close:
            self._transport._release(self._origin, conn)
        else:
            conn.close()


def _usable(conn: _Conn) -> bool:
    """An idle kept-alive connection may take the next request: the server has
    neither closed it nor sent anything unasked on it."""
    sock = conn.sock
    if sock is None:
        return True  # never connected
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    return not poller.poll(0)


class _translated:
    """Foreign errors as httpx's (what the client translates, once, at its edge)."""

    def __init__(
        self,
        request: httpx.Request,
        error: type[httpx.TransportError],
        timeout: type[httpx.TimeoutException],
    ) -> None:
        self._request = request
        self._error = error
        self._timeout = timeout

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, exc: BaseException | None, tb: Any) -> None:
        if exc is None or isinstance(exc, httpx.HTTPError):
            return
        message = str(exc) or type(exc).__name__
        if isinstance(exc, TimeoutError):
            raise self._timeout(message, request=self._request) from exc
        if isinstance(exc, http.client.HTTPException):
            raise httpx.RemoteProtocolError(message, request=self._request) from exc
        if isinstance(exc, OSError):
            raise self._error(message, request=self._request) from exc


def default_transport() -> httpx.BaseTransport:
    """What :class:`~podbay.SandboxClient` sends through unless given a transport."""
    return StdlibTransport()


def default_async_transport() -> httpx.AsyncBaseTransport:
    """What :class:`~podbay.AsyncSandboxClient` sends through unless given one
    (httpx's own: this module's counterpart on asyncio is not written yet)."""
    return httpx.AsyncHTTPTransport()
