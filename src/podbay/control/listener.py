"""The HTTP listener's own guards: slow clients and connection floods.

uvicorn holds a connection that sends half a request head, or a body a byte
a minute, for ever: 20,500 of them exhausted the server's file descriptors,
and the lifecycle pass then failed with "Too many open files". This
protocol (uvicorn's httptools one, plus three guards) bounds all three:

- **head timeout**: a request head (request line and headers) must arrive
  whole within ``head_timeout`` seconds of its first byte, or of the
  connection opening; else 408 ``REQUEST_TIMEOUT`` and the connection closes.
- **body idle timeout**: while a request body is being received, the client
  must send something at least every ``body_timeout`` seconds (time the
  server itself stops reading, by flow control or before ``100 Continue``,
  does not count); else the connection closes and the request is dropped.
- **connection cap**: at most ``max_connections`` connections at once; one
  more is closed as soon as it is accepted, so it never holds a descriptor.
  The cap stays well below the process's descriptor limit (see
  :func:`connection_cap`), which keeps descriptors for the lifecycle,
  the store and the runtime when the listener is saturated.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import resource
import weakref
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from podbay.asgi import BODY_TAKEOVER, RESPONSE_ABORT, RESPONSE_GATHER, TakenBody
from podbay.errors import ApiError
from podbay.wire.codes import ErrorCode

log = logging.getLogger("podbay.serve")

#: Descriptors kept for everything but client connections (store, runtime,
#: agent sockets, pipes of running commands).
RESERVED_DESCRIPTORS = 512
#: A request declaring a body of this size or more may have it taken over
#: (:data:`podbay.asgi.BODY_TAKEOVER`): the gateway's relay then moves it to
#: the agent in the kernel instead of through uvicorn's buffers.
TAKEOVER_FROM = 4 * 1024 * 1024


def raise_descriptor_limit() -> int:
    """Raise the soft descriptor limit to the hard one; returns the soft limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


def connection_cap(wanted: int, descriptor_limit: int) -> int:
    """``wanted``, lowered to leave :data:`RESERVED_DESCRIPTORS` (or half
    the descriptors, on a small limit) to the rest of the server.

    >>> connection_cap(4096, 1024), connection_cap(4096, 65536), connection_cap(100, 65536)
    (512, 4096, 100)
    """
    if descriptor_limit > 2 * RESERVED_DESCRIPTORS:
        room = descriptor_limit - RESERVED_DESCRIPTORS
    else:
        room = descriptor_limit // 2
    return max(1, min(wanted, room))


def guarded_protocol(
    *, head_timeout: float, body_timeout: float, max_connections: int
) -> type[HttpToolsProtocol]:
    """uvicorn's httptools protocol with the guards above (pass as ``http=``)."""

    class GuardedProtocol(HttpToolsProtocol):
        _head_timer: asyncio.TimerHandle | None = None
        _body_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if len(self.connections) > max_connections:
                transport.abort()
                return
            self._arm_head()

        def connection_lost(self, exc: Exception | None) -> None:
            self._cancel()
            super().connection_lost(exc)

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._arm_head()

        _body_length = 0
        _body_seen = 0

        def on_headers_complete(self) -> None:
            self._cancel()
            super().on_headers_complete()
            if self.cycle is not None:
                extensions: dict[str, Any] = self.scope.setdefault("extensions", {})
                # Weakly: the scope is the cycle's own, and a strong reference from
                # it to the cycle (or to this protocol, which holds the cycle) made
                # every request a reference cycle that only the garbage collector
                # freed, twice its collections per exec (docs/performance.md).
                cycle = weakref.ref(self.cycle)
                extensions[RESPONSE_GATHER] = functools.partial(_gathered, cycle)
                extensions[RESPONSE_ABORT] = functools.partial(
                    _abort_weakly, weakref.ref(self), cycle
                )
            if self.cycle is not None and self.cycle.more_body:
                self._arm_body()
                self._offer_body()

        def on_body(self, body: bytes) -> None:
            self._body_seen += len(body)
            super().on_body(body)
            self._arm_body()

        # -- handing a large body over (see TAKEOVER_FROM) -----------------------
        def _offer_body(self) -> None:
            self._body_seen = self._body_length = 0
            for name, value in self.scope["headers"]:
                if name == b"content-length" and value.isdigit():
                    self._body_length = int(value)
            if self._body_length >= TAKEOVER_FROM:
                cycle = self.cycle
                extensions: dict[str, Any] = self.scope.setdefault("extensions", {})
                extensions[BODY_TAKEOVER] = lambda: self._take_body(cycle)

        def _take_body(self, cycle: Any) -> TakenBody | None:
            if (
                cycle is not self.cycle
                or not cycle.more_body
                or cycle.disconnected
                or cycle.waiting_for_100_continue
                or self.transport.is_closing()
            ):
                return None
            self.flow.pause_reading()
            # The parser never sees the rest of the body: the answer ends the connection.
            cycle.keep_alive = False
            head, cycle.body = bytes(cycle.body), bytearray()

            def finished() -> None:
                cycle.more_body = False  # no body timeout from here on

            return TakenBody(
                head=head,
                left=self._body_length - self._body_seen,
                fd=self.transport.get_extra_info("socket").fileno(),
                idle_timeout=body_timeout,
                abort=functools.partial(self._abort, cycle),
                finished=finished,
            )

        def _abort(self, cycle: Any) -> None:
            if cycle is not self.cycle:
                return  # that request is over; the connection serves another
            # Before the app returns: uvicorn then neither answers 500 nor logs
            # an unfinished answer for what is, to it, a client gone.
            cycle.disconnected = True
            self.transport.abort()

        def on_message_complete(self) -> None:
            self._cancel()
            super().on_message_complete()

        # -- timers ------------------------------------------------------------------
        def _arm_head(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
            self._head_timer = self.loop.call_later(head_timeout, self._head_expired)

        def _arm_body(self) -> None:
            if self._body_timer is not None:
                self._body_timer.cancel()
            self._body_timer = self.loop.call_later(body_timeout, self._body_expired)

        def _cancel(self) -> None:
            for timer in (self._head_timer, self._body_timer):
                if timer is not None:
                    timer.cancel()
            self._head_timer = self._body_timer = None

        def _head_expired(self) -> None:
            self._head_timer = None
            if self.transport.is_closing():
                return
            exc = ApiError(
                ErrorCode.REQUEST_TIMEOUT,
                f"the request head did not arrive within {head_timeout:g} s",
            )
            self.transport.write(_answer(exc))
            self.transport.close()

        def _body_expired(self) -> None:
            self._body_timer = None
            cycle: Any = self.cycle
            if self.transport.is_closing() or cycle is None or not cycle.more_body:
                return
            if self.flow.read_paused or cycle.waiting_for_100_continue:
                self._arm_body()  # the server is the one not reading: not the client's idling
                return
            # The request is dropped: its handler sees the client disconnect.
            self.transport.close()

    return GuardedProtocol


def _answer(exc: ApiError) -> bytes:
    body = json.dumps(exc.body()).encode()
    return (
        f"HTTP/1.1 {exc.status} Request Timeout\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\nconnection: close\r\n\r\n"
    ).encode() + body


class _Gathering:
    """A transport whose writes are kept until :meth:`flush` writes them as one;
    everything else is the transport's own (a close writes what was kept first)."""

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        self._parts: list[bytes] = []

    def write(self, data: bytes) -> None:
        self._parts.append(data)

    def flush(self) -> None:
        parts, self._parts = self._parts, []
        if parts and not self._transport.is_closing():
            self._transport.write(b"".join(parts))

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


def _abort_weakly(protocol: weakref.ref[Any], cycle: weakref.ref[Any]) -> None:
    """The protocol's ``_abort`` of the cycle, both held weakly (see
    ``on_headers_complete``); nothing when either is gone."""
    live_protocol, live_cycle = protocol(), cycle()
    if live_protocol is not None and live_cycle is not None:
        live_protocol._abort(live_cycle)


class _gathered:
    """See :data:`podbay.asgi.RESPONSE_GATHER`: the cycle writes to a gathering
    transport meanwhile (uvicorn writes an answer's head and each body message
    on their own). Nothing is gathered for a cycle already gone. A class, not a
    generator context manager: every exec's answer passes here, and contextlib's
    took four more calls."""

    __slots__ = ("_cycle", "_gathering", "_real")

    def __init__(self, ref: weakref.ref[Any]) -> None:
        self._cycle = ref()
        self._gathering: _Gathering | None = None

    def __enter__(self) -> None:
        cycle = self._cycle
        if cycle is not None:
            self._real = cycle.transport
            self._gathering = cycle.transport = _Gathering(self._real)

    def __exit__(self, *exc: object) -> None:
        cycle, self._cycle = self._cycle, None
        if cycle is not None and self._gathering is not None:
            cycle.transport = self._real
            self._gathering.flush()
