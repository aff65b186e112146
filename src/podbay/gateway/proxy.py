"""Relay one HTTP request to an agent over its unix socket, streaming both ways.

A small HTTP/1.1 client on raw asyncio streams with httptools parsing the
answer: an order of magnitude less CPU per request than a general client
such as httpx (docs/performance.md), which is what bounds exec
throughput on a small machine. Request bodies are forwarded as they arrive
from ASGI ``receive`` (re-chunked when the caller sent no length); response
bodies are forwarded chunk by chunk as they are parsed. Memory stays
constant whatever the size: a 1 GiB file passes through 64 KiB at a time.

Whatever answers on the agent's socket is treated as hostile: code in the
sandbox may have taken the socket over. Its answer head is bounded in bytes
(:data:`MAX_RESPONSE_HEAD`) and header count (:data:`MAX_RESPONSE_HEADERS`),
its status must be a final one, and only the headers the contract's answers
use are passed on (never ``Set-Cookie``: the endpoint shares the control
plane's origin). An answer that breaks these is 502 ``AGENT_UNREACHABLE``.

Hop-by-hop headers are dropped both ways; the credential, the client's
``Authorization`` and its cookies never reach the agent. A transport failure
is answered 502 ``AGENT_UNREACHABLE`` when nothing was sent to the client yet,
and never retried (the command may have run).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence

import httptools

from podbay.asgi import (
    BODY_TAKEOVER,
    RESPONSE_GATHER,
    Receive,
    Scope,
    Send,
    TakenBody,
    abort_response,
    send_refusal,
)
from podbay.dataplane.admission import Admission
from podbay.dataplane.agentpool import AgentPool, Connection
from podbay.errors import (
    AgentAnswerInvalid as AgentAnswerInvalid,  # re-exported: defined in the one tree
)
from podbay.errors import ApiError, BodyTooLarge
from podbay.wire.codes import ErrorCode
from podbay.wire.paths import CREDENTIAL_HEADER, DEFAULT_USER_HEADER, REQUEST_ID_HEADER

from . import splice
from .deadline import answer_wait
from .splice import Outcome, splice_in_thread

_REQUEST_ID = REQUEST_ID_HEADER.lower().encode()
_DROP_REQUEST = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"te",
        b"trailer",
        b"trailers",
        b"transfer-encoding",
        b"upgrade",
        b"host",
        b"content-length",
        b"expect",
        CREDENTIAL_HEADER.lower().encode(),
        _REQUEST_ID,
        # Only the gateway tells the agent the operator's default user.
        DEFAULT_USER_HEADER.lower().encode(),
        # The client's credentials for the platform are no business of the sandbox.
        b"authorization",
        b"cookie",
    }
)
#: Answer headers passed on to the client (all others are dropped): what the
#: agent's answers use, nothing that acts on the client (cookies, redirects).
_KEEP_RESPONSE = frozenset(
    {
        b"content-type",
        b"content-length",
        b"allow",
        b"retry-after",
        b"cache-control",
        b"etag",
        b"last-modified",
    }
)
_KEEP_RESPONSE_PREFIX = b"x-podbay-"
READ_SIZE = 64 * 1024
#: Bodies from this size on (and chunked ones) are sent while the agent's answer
#: is already awaited: an agent may answer before it has taken the body (a
#: refusal made from the head, such as a full disk) and then stop reading, and
#: that answer is relayed instead of the failed write's 502. Smaller bodies fit
#: the agent's buffers (it reads and discards what a refusal leaves) and skip
#: the second task.
EARLY_ANSWER_FROM = 1024 * 1024
#: A declared body up to this size is read from the client before the agent is
#: reached and sent in the same write as the head.
COALESCE_BODY = 64 * 1024
#: Largest answer head (status line and headers) read from an agent.
MAX_RESPONSE_HEAD = 64 * 1024
#: Most answer headers read from an agent.
MAX_RESPONSE_HEADERS = 100


async def send_error(send: Send, exc: ApiError, request_id: str) -> None:
    await send_refusal(send, exc, (_REQUEST_ID, request_id.encode()))


class _Response:
    """httptools callbacks, collected for the relay loop to forward."""

    def __init__(self) -> None:
        self.headers: list[tuple[bytes, bytes]] = []
        self.headers_done = False
        self.body: list[bytes] = []
        self.done = False
        self.keep_alive = False
        self.parser: httptools.HttpResponseParser | None = None

    def on_header(self, name: bytes, value: bytes) -> None:
        if len(self.headers) >= MAX_RESPONSE_HEADERS:
            raise AgentAnswerInvalid(f"more than {MAX_RESPONSE_HEADERS} headers")
        self.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        self.headers_done = True

    def on_body(self, body: bytes) -> None:
        self.body.append(bytes(body))

    def on_message_complete(self) -> None:
        # Asked here: llhttp resets its flags once the message is complete.
        assert self.parser is not None
        self.keep_alive = self.parser.should_keep_alive()
        self.done = True
        # The parser holds this object's callbacks: dropped now, the pair is freed
        # at once after the relay instead of by the garbage collector.
        self.parser = None


async def _whole_body(receive: Receive) -> bytes:
    """The client's whole body (a small one: see :data:`COALESCE_BODY`)."""
    parts: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ConnectionAbortedError("the client went away")
        chunk = message.get("body", b"")
        if not message.get("more_body", False):
            return b"".join((*parts, chunk)) if parts else chunk
        parts.append(chunk)


async def _client_body(receive: Receive) -> AsyncIterator[bytes]:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ConnectionAbortedError("the client went away")
        chunk = message.get("body", b"")
        if chunk:
            yield chunk
        if not message.get("more_body", False):
            return


def _request_head(
    scope: Scope, target: bytes, request_id: str, extra: Sequence[tuple[bytes, bytes]] = ()
) -> tuple[bytes, str]:
    """The head to send and how the body is framed: "none", "length" or "chunked"."""
    lines = [scope["method"].encode(), b" ", target, b" HTTP/1.1\r\nhost: agent\r\n"]
    for key, value in extra:
        lines += [key, b": ", value, b"\r\n"]
    framing = "none"
    for key, value in scope["headers"]:
        if key == b"content-length":
            if value.strip() not in (b"", b"0"):
                framing = "length"
                lines += [b"content-length: ", value, b"\r\n"]
        elif key == b"transfer-encoding":
            framing = "chunked"
        elif key not in _DROP_REQUEST:
            lines += [key, b": ", value, b"\r\n"]
    if framing == "chunked":
        lines.append(b"transfer-encoding: chunked\r\n")
    lines += [_REQUEST_ID, b": ", request_id.encode(), b"\r\n\r\n"]
    return b"".join(lines), framing


async def relay(
    pool: AgentPool,
    scope: Scope,
    receive: Receive,
    send: Send,
    target: bytes,
    request_id: str,
    body_limit: int | None = None,
    extra_headers: Sequence[tuple[bytes, bytes]] = (),
    before_unreachable: Callable[[], Awaitable[None]] | None = None,
    admission: Admission | None = None,
    answer_seconds: float | None = None,
    before_timeout: Callable[[], Awaitable[None]] | None = None,
) -> int:
    """Forward one request; returns the status the client got.

    ``body_limit``: the most request-body bytes relayed; a larger declared
    length is refused before the agent is reached, a larger streamed body
    as soon as it passes the limit (413 ``REQUEST_TOO_LARGE`` either way).
    ``before_unreachable``: awaited when the agent does not answer, before
    the client hears its 502, so that what it starts (a check of the machine)
    is under way before the client can act on the 502 (attach again).
    ``admission``: the sandbox's slots (429 ``SANDBOX_BUSY`` when none comes);
    taken once a small body is read whole, so a client that stalls sending
    one holds no agent connection. ``answer_seconds``: the operator's bound
    on the agent's start of answer (see :mod:`.deadline`); past it the
    client gets 504 ``AGENT_TIMEOUT``, after ``before_timeout`` is awaited.
    """
    head, framing = _request_head(scope, target, request_id, extra_headers)
    if (
        body_limit is not None
        and framing == "length"
        and int(_header(scope, b"content-length")) > body_limit
    ):
        return await _too_large(send, request_id, body_limit)
    sent = 0
    body: bytes | None = b"" if framing == "none" else None
    if framing == "length" and int(_header(scope, b"content-length")) <= COALESCE_BODY:
        # A small body (an exec's JSON) goes out with the head in one write: one
        # send here and one wake-up and read in the agent instead of two each.
        try:
            body = await _whole_body(receive)
        except ConnectionAbortedError:
            return 499
        head += body
        sent = len(body)
        framing = "none"
    wait = None
    if answer_seconds is not None:
        wait = answer_wait(scope["method"].encode(), target, body, answer_seconds)
    streams = framing != "none"
    if admission is not None:
        try:
            await admission.acquire(streams=streams)
        except ApiError as exc:
            await send_error(send, exc, request_id)
            return exc.status
    try:
        return await _relay_admitted(
            pool,
            scope,
            receive,
            send,
            request_id,
            body_limit,
            before_unreachable,
            head,
            framing,
            sent,
            wait,
            before_timeout,
        )
    finally:
        if admission is not None:
            admission.release(streams=streams)


async def _relay_admitted(
    pool: AgentPool,
    scope: Scope,
    receive: Receive,
    send: Send,
    request_id: str,
    body_limit: int | None,
    before_unreachable: Callable[[], Awaitable[None]] | None,
    head: bytes,
    framing: str,
    sent: int,
    wait: float | None,
    before_timeout: Callable[[], Awaitable[None]] | None,
) -> int:
    """:func:`relay`'s exchange with the agent, once the request holds its slot."""
    try:
        conn = await pool.acquire()
    except OSError:
        return await _unreachable(send, request_id, before_unreachable)
    started = False
    gone = asyncio.Event()
    watcher: asyncio.Task[None] | None = None
    deadline: asyncio.TimerHandle | None = None
    late = asyncio.Event()
    try:
        conn = await _send_head(pool, conn, head)
    except OSError:
        return await _unreachable(send, request_id, before_unreachable)
    reader, writer = conn
    try:
        reading, delivered = await _deliver(
            reader, writer, framing, scope, receive, body_limit, sent
        )
        # An agent may take its time (a long exec) or never answer (a hijacked
        # one): a client that leaves meanwhile releases the agent connection.
        watcher = asyncio.create_task(_watch_client(receive, writer, gone))
        if wait is not None:
            # Ends the read below (the connection is dropped) when the agent
            # has not started its answer in time.
            deadline = asyncio.get_running_loop().call_later(wait, _expire, writer.transport, late)

        response = _Response()
        parser = response.parser = httptools.HttpResponseParser(response)
        head_bytes = 0
        # The listener's gathering, once an answer is whole in hand (see _gather).
        gathered: contextlib.AbstractContextManager[None] | None = None
        try:
            while not response.done:
                if reading is not None:
                    data, reading = await reading, None
                else:
                    data = await reader.read(READ_SIZE)
                if not data:
                    raise ConnectionResetError("the agent closed the connection")
                parser.feed_data(data)
                if not response.headers_done:
                    # httptools keeps a partial head in memory: stop feeding it early.
                    head_bytes += len(data)
                    if head_bytes > MAX_RESPONSE_HEAD:
                        raise AgentAnswerInvalid("answer head too large")
                elif not started:
                    if deadline is not None:
                        deadline.cancel()
                    status = parser.get_status_code()
                    if not 200 <= status <= 599:
                        raise AgentAnswerInvalid(f"status {status} is not a final answer")
                    headers = [(k, v) for k, v in response.headers if _passed_on(k)]
                    headers.append((_REQUEST_ID, request_id.encode()))
                    if response.done:  # the whole answer is in hand (an exec's)
                        gathered = _gather(scope)
                    await send(
                        {"type": "http.response.start", "status": status, "headers": headers}
                    )
                    started = True
                if response.body:
                    chunks, response.body = response.body, []
                    for chunk in chunks:
                        await send({"type": "http.response.body", "body": chunk, "more_body": True})
            watcher.cancel()  # the answer's end reads as a disconnect: stop watching first
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            if gathered is not None:
                gathered.__exit__(None, None, None)
        if response.keep_alive and not gone.is_set() and delivered:
            pool.release(conn)
        else:
            writer.close()
        return status
    except ConnectionAbortedError:  # the client left: drop the agent connection too
        writer.close()
        return 499
    except BodyTooLarge:
        writer.close()
        return await _too_large(send, request_id, body_limit or 0)
    except (OSError, httptools.HttpParserError, AgentAnswerInvalid):
        # (A callback's AgentAnswerInvalid arrives as HttpParserCallbackError.)
        writer.close()
        if gone.is_set():
            return 499
        if late.is_set() and not started:
            return await _timed_out(send, request_id, before_timeout, wait or 0.0)
        if not started:
            return await _unreachable(send, request_id, before_unreachable)
        # Mid-body: nothing can be said now but that the answer is not whole.
        if before_unreachable is not None:
            await before_unreachable()
        abort_response(scope)
        return 502
    except BaseException:
        writer.close()
        raise
    finally:
        if watcher is not None:
            watcher.cancel()
        if deadline is not None:
            deadline.cancel()


def _expire(transport: asyncio.WriteTransport, late: asyncio.Event) -> None:
    late.set()
    transport.abort()  # the relay's read sees the end and answers 504


async def _watch_client(
    receive: Receive, writer: asyncio.StreamWriter, gone: asyncio.Event
) -> None:
    """Close the agent connection when the client disconnects (wakes the relay's read)."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            gone.set()
            writer.close()
            return


async def _send_head(pool: AgentPool, conn: Connection, head: bytes) -> Connection:
    """Send the request head on ``conn``, or, when the agent had already shut that
    connection (an idle agent hibernating shuts its kept-alive connections: the
    write fails and nothing was delivered), on a new one."""
    try:
        return await _write_head(conn, head)
    except OSError:
        return await _write_head(await pool.connect(), head)


async def _write_head(conn: Connection, head: bytes) -> Connection:
    writer = conn[1]
    writer.write(head)
    try:
        await writer.drain()
    except OSError:
        writer.close()
        raise
    return conn


async def _send_request(
    writer: asyncio.StreamWriter,
    head: bytes,
    framing: str,
    receive: Receive,
    body_limit: int | None,
) -> None:
    writer.write(head)
    await _send_body(writer, framing, receive, body_limit)


async def _deliver(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    framing: str,
    scope: Scope,
    receive: Receive,
    body_limit: int | None,
    sent: int = 0,
) -> tuple[asyncio.Future[bytes] | None, bool]:
    """Send the body (``sent`` bytes of it went with the head); returns a read of
    the answer already under way (or None), and whether the agent took the whole
    body (else the connection is not reused)."""
    takeover = (scope.get("extensions") or {}).get(BODY_TAKEOVER)
    if (
        framing == "length"
        and not sent
        and body_limit is None
        and takeover is not None
        and splice.available()
    ):
        taken: TakenBody | None = takeover()
        if taken is not None:
            # Read from the start: an answer given before the body is taken
            # must be in hand before the agent's hang-up turns into an error.
            reading = asyncio.ensure_future(reader.read(READ_SIZE))
            try:
                return reading, await _splice(writer, taken)
            except BaseException:
                reading.cancel()
                raise
    if framing == "none" or (
        framing == "length" and int(_header(scope, b"content-length")) < EARLY_ANSWER_FROM
    ):
        await _send_body(writer, framing, receive, body_limit, sent)
        return None, True
    reading = asyncio.ensure_future(reader.read(READ_SIZE))
    sending = asyncio.ensure_future(_send_body(writer, framing, receive, body_limit, sent))
    try:
        await asyncio.wait((reading, sending), return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        reading.cancel()
        sending.cancel()
        raise
    if not sending.done():
        # The agent answered (or hung up) before taking the whole body.
        sending.cancel()
        await asyncio.wait((sending,))
        if not sending.cancelled():
            sending.exception()  # retrieved: the answer is what counts now
        return reading, False
    failed = sending.exception()
    if failed is None:
        return reading, True
    if isinstance(failed, OSError) and not isinstance(failed, ConnectionAbortedError):
        return reading, False  # the agent stopped reading: its answer, if it gave one
    reading.cancel()
    raise failed


async def _splice(writer: asyncio.StreamWriter, taken: TakenBody) -> bool:
    """The body the listener handed over, to the agent by ``splice``; whether the
    agent took it all (else its answer, if it gave one, is read next)."""
    # The thread works on its own descriptors: either transport may close its
    # own meanwhile (an agent that hangs up resets the connection), and a
    # number closed under the thread could be reused by another connection.
    # Nothing more goes through the stream: a write that fails there closes the
    # transport and loses an answer the agent gave before hanging up.
    src = os.dup(taken.fd)
    dst = -1
    try:
        if writer.transport.get_write_buffer_size():
            # The head must be out before the kernel appends to the same socket.
            writer.transport.set_write_buffer_limits(0)
            with contextlib.suppress(OSError):
                await writer.drain()
            if not writer.transport.is_closing():
                writer.transport.set_write_buffer_limits()
        if not writer.transport.is_closing():
            dst = os.dup(writer.get_extra_info("socket").fileno())
        # dst -1: the agent hung up already (it may have answered): the body is dropped.
        outcome = await splice_in_thread(src, dst, taken.left, taken.idle_timeout, taken.head)
    finally:
        os.close(src)
        if dst >= 0:
            os.close(dst)
    if outcome is not Outcome.DONE and outcome is not Outcome.AGENT_GONE:
        taken.abort()
        raise ConnectionAbortedError("the client went away")
    taken.finished()
    return outcome is Outcome.DONE


async def _send_body(
    writer: asyncio.StreamWriter,
    framing: str,
    receive: Receive,
    body_limit: int | None,
    sent: int = 0,
) -> None:
    """The rest of the body (``sent`` bytes of it went with the head)."""
    if framing == "none":
        await writer.drain()
        return
    async for chunk in _client_body(receive):
        sent += len(chunk)
        if body_limit is not None and sent > body_limit:
            raise BodyTooLarge(body_limit)
        writer.write(chunk if framing == "length" else b"%x\r\n%b\r\n" % (len(chunk), chunk))
        await writer.drain()
    if framing == "chunked":
        writer.write(b"0\r\n\r\n")
    await writer.drain()


def _gather(scope: Scope) -> contextlib.AbstractContextManager[None] | None:
    """Have the listener write what is sent until the context manager returned
    (entered) exits as one write, where it offers that
    (:data:`podbay.asgi.RESPONSE_GATHER`). Entered and left by hand, not through
    an ExitStack: this is every exec's path, and the stack cost seven calls."""
    gather = (scope.get("extensions") or {}).get(RESPONSE_GATHER)
    if gather is None:
        return None
    gathered: contextlib.AbstractContextManager[None] = gather()
    gathered.__enter__()
    return gathered


def _header(scope: Scope, name: bytes) -> bytes:
    for key, value in scope["headers"]:
        if key == name:
            return bytes(value)
    return b""


async def _too_large(send: Send, request_id: str, limit: int) -> int:
    exc = ApiError(ErrorCode.REQUEST_TOO_LARGE, f"the request body is over {limit} bytes")
    await send_error(send, exc, request_id)
    return exc.status


def _passed_on(name: bytes) -> bool:
    return name in _KEEP_RESPONSE or name.startswith(_KEEP_RESPONSE_PREFIX)


async def _timed_out(
    send: Send, request_id: str, before: Callable[[], Awaitable[None]] | None, seconds: float
) -> int:
    if before is not None:
        await before()
    exc = ApiError(
        ErrorCode.AGENT_TIMEOUT, f"the sandbox's agent did not answer within {seconds:g} s"
    )
    await send_error(send, exc, request_id)
    return exc.status


async def _unreachable(
    send: Send, request_id: str, before: Callable[[], Awaitable[None]] | None = None
) -> int:
    if before is not None:
        await before()
    exc = ApiError(ErrorCode.AGENT_UNREACHABLE, "the sandbox's agent did not answer")
    await send_error(send, exc, request_id)
    return exc.status
