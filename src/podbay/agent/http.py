"""A small threaded HTTP/1.1 server on raw sockets.

Why hand-written: the agent runs on the sandbox image's bare interpreter
with no packages at all, so uvicorn, h11 and friends are out. Of the
standard library, ``asyncio`` and ``http.server`` each take about as long to
import as the agent's whole budget from start to first answer, and about as
much memory as its whole idle footprint (figures: docs/performance.md). What
the agent needs of HTTP is small: one request at a time per connection (no
pipelining beyond reading the next request after the last answer),
keep-alive, ``Content-Length`` and chunked request bodies, and
``Content-Length`` or chunked responses, streamed. That is this module: a
thread per connection, blocking ``recv`` and ``sendall``.

Hostile input never takes the server down: the head is capped in size and
header count, chunk sizes and lengths are checked, and any protocol fault
is answered (through the ``refuse`` callback, so the body follows the
contract) and the connection closed.
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from podbay.errors import Aborted as Aborted
from podbay.errors import ProtocolError as ProtocolError  # re-exported: defined in the one tree

#: Largest request head (request line + headers) accepted.
MAX_HEAD_BYTES = 64 * 1024
MAX_HEADERS = 100
#: A chunk-size line or trailer line longer than this is refused.
MAX_LINE = 4096
#: Idle keep-alive connections (and stalled uploads) are dropped after this.
IDLE_TIMEOUT_SECONDS = 600
#: After an answer that left the request body unread, at most this much is
#: read and discarded to keep the connection; more, and it is closed.
DRAIN_LIMIT = 8 * 1024 * 1024
#: One receive's most. Under glibc's mmap threshold (128 KiB): a larger buffer
#: was an mmap, an mremap and an munmap per receive (three traps under gVisor,
#: twice per request); large bodies are read straight into their destination.
RECV_SIZE = 64 * 1024
#: How long a connection closed with its request body unread is read (and the
#: bytes dropped) before it is closed (see :func:`_linger`).
LINGER_SECONDS = 2.0

REASONS = {
    100: "Continue",
    101: "Switching Protocols",
    200: "OK",
    204: "No Content",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    409: "Conflict",
    413: "Content Too Large",
    422: "Unprocessable Content",
    429: "Too Many Requests",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    501: "Not Implemented",
    505: "HTTP Version Not Supported",
    507: "Insufficient Storage",
}


@dataclass
class Response:
    """An answer. ``body`` is bytes, or an iterable of chunks streamed out
    with ``length`` as ``Content-Length`` (chunked when ``length`` is None)."""

    status: int
    body: bytes | Iterable[bytes] = b""
    headers: list[tuple[str, str]] = field(default_factory=list)
    length: int | None = None
    content_type: str | None = "application/json"
    #: With status 101: takes the connection over once the head is sent, with
    #: the bytes already received past the request; the socket is closed after.
    upgrade: Callable[[socket.socket, bytes], None] | None = None


# Refusals of a request cut short or too large, as (status, message).
_BODY_CUT = (400, "connection closed in the middle of the body")
_LINE_TOO_LONG = (400, "line too long in the chunked body")
_HEAD_CUT = (400, "connection closed in the middle of the request head")
_HEAD_TOO_LARGE = (431, "request head too large")


class _Connection:
    """One accepted socket and its receive buffer."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = bytearray()

    def fill(self) -> bool:
        """Receive more into the buffer; False at end of stream."""
        data = self.sock.recv(RECV_SIZE)
        if not data:
            return False
        self.buf += data
        return True

    def peer_closed(self) -> bool:
        """True when the client closed its side and sent nothing more (checked
        without consuming: a pipelined request waiting is not a close)."""
        if self.buf:
            return False
        try:
            return self.sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
        except BlockingIOError:
            return False
        except OSError:
            return True

    def take(self, n: int) -> bytes:
        """Up to ``n`` bytes, from the buffer first, else one ``recv``."""
        if not self.buf and not self.fill():
            raise ProtocolError(*_BODY_CUT)
        data = bytes(self.buf[:n])
        del self.buf[:n]
        return data

    def take_into(self, view: memoryview) -> int:
        """Fill up to ``len(view)`` bytes of ``view``: from the buffer first, else
        straight from the socket (no intermediate copy: the bulk of a large body)."""
        if self.buf:
            n = min(len(view), len(self.buf))
            view[:n] = self.buf[:n]
            del self.buf[:n]
            return n
        n = self.sock.recv_into(view)
        if not n:
            raise ProtocolError(*_BODY_CUT)
        return n

    def line(self) -> bytes:
        """One CRLF-terminated line (without it), at most MAX_LINE bytes."""
        data = self.until(b"\r\n", MAX_LINE, _LINE_TOO_LONG, _BODY_CUT)
        if data is None:
            raise ProtocolError(*_BODY_CUT)
        return data

    def until(
        self, mark: bytes, limit: int, too_long: tuple[int, str], cut: tuple[int, str]
    ) -> bytes | None:
        """The bytes before the next ``mark`` (both consumed), at most ``limit``
        of them (else ``too_long``); None when the stream ends cleanly first,
        ``cut`` when it ends with a part of them received."""
        while True:
            end = self.buf.find(mark)
            if end > limit or (end < 0 and len(self.buf) > limit):
                raise ProtocolError(*too_long)
            if end >= 0:
                data = bytes(self.buf[:end])
                del self.buf[: end + len(mark)]
                return data
            if not self.fill():
                if self.buf:
                    raise ProtocolError(*cut)
                return None


class Body:
    """A request body, read incrementally (``Content-Length`` or chunked)."""

    def __init__(
        self,
        conn: _Connection,
        length: int | None,
        chunked: bool,
        on_first_read: Callable[[], None] | None = None,
    ) -> None:
        self._conn = conn
        #: The declared length (``Content-Length``); None when chunked.
        self.length = None if chunked else length or 0
        self._left = length or 0  # bytes left: whole body, or current chunk
        self._chunked = chunked
        self._done = not chunked and not length
        self._on_first_read = on_first_read
        self.received = 0

    @property
    def finished(self) -> bool:
        return self._done

    @property
    def unread(self) -> int | None:
        """Bytes of the body not read yet, where the framing says (not chunked)."""
        return None if self._chunked else self._left

    def read(self, n: int = RECV_SIZE) -> bytes:
        """Up to ``n`` bytes of body; ``b""`` once it is all read."""
        room = self._room()
        if not room:
            return b""
        data = self._conn.take(min(n, room))
        self._took(len(data))
        return data

    def readinto(self, view: memoryview) -> int:
        """Like :meth:`read`, into ``view``; 0 once the body is all read."""
        room = self._room()
        if not room or not len(view):
            return 0
        n = self._conn.take_into(view[:room] if room < len(view) else view)
        self._took(n)
        return n

    def _room(self) -> int:
        """How much the next read may take (0: the body is over)."""
        if self._done:
            return 0
        if self._on_first_read is not None:
            self._on_first_read()
            self._on_first_read = None
        if self._chunked and self._left == 0:
            self._next_chunk()
            if self._done:
                return 0
        return self._left

    def _took(self, n: int) -> None:
        self._left -= n
        self.received += n
        if self._left == 0:
            if self._chunked:
                if self._conn.line() != b"":
                    raise ProtocolError(400, "chunk data is longer than its size")
            else:
                self._done = True

    def read_all(self, limit: int) -> bytes:
        """The whole body; :class:`ProtocolError` 413 when over ``limit``."""
        parts = []
        while data := self.read():
            parts.append(data)
            if self.received > limit:
                raise ProtocolError(413, f"request body larger than {limit} bytes")
        return b"".join(parts)

    def _next_chunk(self) -> None:
        raw = self._conn.line().split(b";", 1)[0].strip()
        if not raw or len(raw) > 16 or any(c not in b"0123456789abcdefABCDEF" for c in raw):
            raise ProtocolError(400, "bad chunk size in the request body")
        size = int(raw, 16)
        if size == 0:
            trailers = 0
            while self._conn.line() != b"":
                trailers += 1
                if trailers > MAX_HEADERS:
                    raise ProtocolError(400, "too many trailers")
            self._done = True
            return
        self._left = size


@dataclass
class Request:
    """One parsed request: its head, and its body as a stream."""

    method: str
    target: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]  # lower-case names; repeated headers joined by ", "
    body: Body
    keep_alive: bool
    #: Filled by the router: values taken from the path (a process id).
    params: dict[str, str] = field(default_factory=dict)
    #: The connection's fd and a check that the client closed it (for an exec
    #: that must end when nobody waits for it any more).
    peer: tuple[int, Callable[[], bool]] | None = None


Handler = Callable[[Request], Response]
Refuse = Callable[[int, str], Response]


def _read_head(conn: _Connection) -> bytes | None:
    """The request head without its final blank line; None on a clean close."""
    # Tolerate blank lines between requests (RFC 9112 2.2).
    while True:
        while conn.buf[:2] == b"\r\n":
            del conn.buf[:2]
        if conn.buf and conn.buf != b"\r":  # a request has begun
            break
        if not conn.fill():
            if conn.buf:
                raise ProtocolError(*_HEAD_CUT)
            return None
    return conn.until(b"\r\n\r\n", MAX_HEAD_BYTES, _HEAD_TOO_LARGE, _HEAD_CUT)


def parse_query(raw_query: str) -> dict[str, str]:
    """The fields of a request's query string (a 400 when malformed)."""
    # Imported with the first query string rather than at start-up: urllib.parse
    # brings ipaddress, a noticeable part of a gVisor agent's start.
    from urllib.parse import parse_qsl

    try:
        return dict(
            parse_qsl(raw_query, keep_blank_values=True, max_num_fields=100, errors="strict")
        )
    except ValueError as exc:
        raise ProtocolError(400, f"malformed query string ({exc})") from None


def parse_request(conn: _Connection, send_continue: Callable[[], None]) -> Request | None:
    """Read and check one request head; its body is left on the connection."""
    head = _read_head(conn)
    if head is None:
        return None
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[0].isalpha() or not parts[2].startswith("HTTP/"):
        raise ProtocolError(400, "malformed request line")
    method, target, version = parts
    if version not in ("HTTP/1.1", "HTTP/1.0"):
        raise ProtocolError(505, f"{version} is not supported")
    if len(lines) - 1 > MAX_HEADERS:
        raise ProtocolError(431, f"more than {MAX_HEADERS} headers")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if not sep or not name or name != name.strip() or " " in name or "\t" in name:
            raise ProtocolError(400, "malformed header line")
        key = name.lower()
        value = value.strip(" \t")
        headers[key] = f"{headers[key]}, {value}" if key in headers else value
    if not target.startswith("/"):
        raise ProtocolError(400, "request target must be a path")
    path, _, raw_query = target.partition("?")
    query = parse_query(raw_query) if raw_query else {}
    connection = headers.get("connection", "").lower()
    keep_alive = "close" not in connection if version == "HTTP/1.1" else "keep-alive" in connection
    length: int | None = None
    chunked = False
    if "transfer-encoding" in headers:
        if headers["transfer-encoding"].lower() != "chunked":
            raise ProtocolError(501, "only the chunked transfer coding is supported")
        if "content-length" in headers:
            raise ProtocolError(400, "both Content-Length and Transfer-Encoding given")
        chunked = True
    elif "content-length" in headers:
        values = {v.strip() for v in headers["content-length"].split(",")}
        value = values.pop()
        if values or not value.isdigit() or len(value) > 18:
            raise ProtocolError(400, "malformed Content-Length")
        length = int(value)
    expects = headers.get("expect", "").lower() == "100-continue"
    body = Body(conn, length, chunked, send_continue if expects else None)
    return Request(
        method,
        target,
        path,
        query,
        headers,
        body,
        keep_alive,
        peer=(conn.sock.fileno(), conn.peer_closed),
    )


def _head(status: int, headers: list[tuple[str, str]]) -> bytes:
    lines = [f"HTTP/1.1 {status} {REASONS.get(status, 'Unknown')}"]
    lines.extend(f"{k}: {v}" for k, v in headers)
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def write_response(sock: socket.socket, resp: Response, keep_alive: bool) -> bool:
    """Send ``resp``; False when the connection must be closed afterwards."""
    headers = list(resp.headers)
    if resp.content_type and resp.status != 204:
        headers.append(("Content-Type", resp.content_type))
    if not keep_alive:
        headers.append(("Connection", "close"))
    body = resp.body
    if isinstance(body, bytes | bytearray):
        if resp.status != 204:
            headers.append(("Content-Length", str(len(body))))
        sock.sendall(_head(resp.status, headers) + body)
        return keep_alive
    try:
        return _write_streamed(sock, resp, body, headers, keep_alive)
    finally:
        close = getattr(body, "close", None)
        if close is not None:
            close()


def _write_streamed(
    sock: socket.socket,
    resp: Response,
    body: Iterable[bytes],
    headers: list[tuple[str, str]],
    keep_alive: bool,
) -> bool:
    if resp.length is not None:
        headers.append(("Content-Length", str(resp.length)))
        sock.sendall(_head(resp.status, headers))
        sent = 0
        for chunk in body:
            sock.sendall(chunk)
            sent += len(chunk)
        if sent != resp.length:
            raise Aborted(f"body of {sent} bytes, {resp.length} promised")
        return keep_alive
    headers.append(("Transfer-Encoding", "chunked"))
    sock.sendall(_head(resp.status, headers))
    for chunk in body:
        if chunk:
            sock.sendall(b"%x\r\n%b\r\n" % (len(chunk), chunk))
    sock.sendall(b"0\r\n\r\n")
    return keep_alive


def _linger(sock: socket.socket) -> None:
    """After an answer given before the body was read, stop sending and drop what
    the client still sends, for a moment, before closing: a socket closed with
    unread data resets the connection, and the client (the gateway, still
    writing the body) can lose the answer with it."""
    deadline = time.monotonic() + LINGER_SECONDS
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_WR)
        while (left := deadline - time.monotonic()) > 0:
            sock.settimeout(left)
            if not sock.recv(RECV_SIZE):
                return


def _drain(body: Body) -> bool:
    """Discard what is left of an unread body; False when too much is left."""
    try:
        while body.read():
            if body.received > DRAIN_LIMIT:
                return False
    except (ProtocolError, OSError):
        return False
    return True


class Connections:
    """The open connections, and whether each is between requests (waiting for
    the next one with nothing of it received), so that an idle server can close
    them all without cutting a request short (:meth:`close_if_idle`)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        #: Every open connection: True while it waits for its next request.
        self._waiting: dict[socket.socket, bool] = {}
        self._last_active = time.monotonic()

    def opened(self, sock: socket.socket) -> None:
        with self._lock:
            self._waiting[sock] = False
            self._last_active = time.monotonic()

    def closed(self, sock: socket.socket) -> None:
        with self._lock:
            self._waiting.pop(sock, None)
            self._last_active = time.monotonic()

    def wait_for_request(self, sock: socket.socket) -> bool:
        """Block until the next request's first byte has arrived, without taking
        it from the socket; False when the peer closed the connection instead."""
        with self._lock:
            self._waiting[sock] = True
            self._last_active = time.monotonic()
        try:
            return sock.recv(1, socket.MSG_PEEK) != b""
        finally:
            with self._lock:
                self._waiting[sock] = False
                self._last_active = time.monotonic()

    def close_if_idle(self, idle_seconds: float) -> bool:
        """When every connection has waited for ``idle_seconds`` or more with no
        request under way, shut their receiving side and return True.

        Checked under the lock that every waiter takes when its next request
        arrives, and the request's bytes stay in the socket until then. After the
        shutdown a client's write fails (EPIPE on a unix socket) rather than
        reaching a server that will not read it; a request whose first bytes came
        in before the shutdown is still read and answered (False is returned
        then): so no request is ever dropped unanswered.
        """
        with self._lock:
            if not all(self._waiting.values()):
                return False
            if time.monotonic() - self._last_active < idle_seconds:
                return False
            for sock in self._waiting:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RD)
            return not any(_has_bytes(sock) for sock in self._waiting)


def _has_bytes(sock: socket.socket) -> bool:
    try:
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) != b""
    except OSError:
        return False


def serve_connection(
    sock: socket.socket, handler: Handler, refuse: Refuse, connections: Connections | None = None
) -> None:
    """Answer requests on one connection until either side closes it (``connections``:
    where it was registered as opened, by the accepting thread)."""
    conn = _Connection(sock)
    sent_continue = False

    def send_continue() -> None:
        nonlocal sent_continue
        if not sent_continue:
            sent_continue = True
            sock.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")

    try:
        while True:
            sent_continue = False
            if connections is not None and not conn.buf and not connections.wait_for_request(sock):
                return
            try:
                req = parse_request(conn, send_continue)
            except ProtocolError as exc:
                write_response(sock, refuse(exc.status, exc.message), keep_alive=False)
                return
            if req is None:
                return
            try:
                resp = handler(req)
            except ProtocolError as exc:
                write_response(sock, refuse(exc.status, exc.message), keep_alive=False)
                return
            # A handler's bug answers 500 (traceback logged), the agent serves on.
            except Exception:  # noqa: BLE001
                import traceback  # only for bugs: keeps start-up lean

                traceback.print_exc(file=sys.stderr)
                resp = refuse(500, "the agent failed unexpectedly; see its log")
                req.keep_alive = False
            if resp.upgrade is not None and resp.status == 101 and req.body.finished:
                sock.sendall(_head(101, resp.headers))
                resp.upgrade(sock, bytes(conn.buf))
                return
            keep = req.keep_alive
            if keep and not req.body.finished:
                # A client that asked to wait for 100 Continue never got it: its
                # body is not coming, so the connection cannot be reused. Nor is
                # it worth keeping when more is left than would be drained: the
                # answer (a refusal, say a full disk) goes out now instead.
                unread = req.body.unread
                keep = (
                    not (req.headers.get("expect") and not sent_continue)
                    and (unread is None or unread <= DRAIN_LIMIT)
                    and _drain(req.body)
                )
            if not write_response(sock, resp, keep):
                if not req.body.finished:
                    _linger(sock)
                return
    except (OSError, Aborted):
        return  # peer gone, idle timeout, or a body cut on purpose
    finally:
        if connections is not None:
            connections.closed(sock)
        with contextlib.suppress(OSError):
            sock.close()


#: A connection the spare thread serves is dropped after this long idle, so that
#: the spare is soon free again.
SPARE_IDLE_TIMEOUT_SECONDS = 5


class _Spare:
    """A connection thread started up front, for when no new thread can be had
    (a fork bomb holds the sandbox at its pids limit): it serves one connection
    at a time, so the request that ends the bomb (``DELETE /v1/processes``) still
    gets through."""

    def __init__(
        self, handler: Handler, refuse: Refuse, connections: Connections | None = None
    ) -> None:
        self._handler = handler
        self._refuse = refuse
        self._connections = connections
        self._cond = threading.Condition()
        self._sock: socket.socket | None = None
        self._busy = False

    def start(self) -> None:
        threading.Thread(target=self._run, name="http-spare", daemon=True).start()

    def offer(self, sock: socket.socket) -> bool:
        """Hand ``sock`` to the spare; False when it is busy."""
        with self._cond:
            if self._busy or self._sock is not None:
                return False
            sock.setsockopt(
                socket.SOL_SOCKET, socket.SO_RCVTIMEO, _timeval(SPARE_IDLE_TIMEOUT_SECONDS)
            )
            self._sock = sock
            self._cond.notify()
            return True

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._sock is None:
                    self._cond.wait()
                sock, self._sock = self._sock, None
                self._busy = True
            try:
                serve_connection(sock, self._handler, self._refuse, self._connections)
            finally:
                with self._cond:
                    self._busy = False


#: Connection threads kept, once their connection closed, for the next ones: a
#: thread start costs a clone and, under gVisor's ptrace platform, a new host
#: thread, the larger part of a request on a new connection there.
IDLE_THREADS = 4


class Server:
    """Accept connections on ``listener``; one thread per connection, kept
    (up to :data:`IDLE_THREADS` idle) to serve a later one.

    With ``on_idle``, the accepting thread calls it (with :attr:`connections`)
    whenever ``idle_poll_seconds`` pass without a new connection; it may end
    the process (see :mod:`.hibernate`). Only this thread accepts, so none is
    accepted meanwhile: a new one waits in the listening socket's backlog.
    """

    def __init__(
        self,
        listener: socket.socket,
        handler: Handler,
        refuse: Refuse,
        on_idle: Callable[[Connections], None] | None = None,
        idle_poll_seconds: float = 1.0,
        reopen: Callable[[], socket.socket] | None = None,
    ) -> None:
        self.listener = listener
        #: Parking (:mod:`.park`): blocks until the sandbox runs again, then
        #: returns a new listener. None: this server cannot park.
        self.reopen = reopen
        self._wake_r, self._wake_w = os.pipe() if reopen is not None else (-1, -1)
        #: Accepted connections, closed ones pruned at each accept: what a park shuts.
        self._accepted: set[socket.socket] = set()
        self.handler = handler
        self.refuse = refuse
        self.on_idle = on_idle
        self.idle_poll_ms = int(idle_poll_seconds * 1000)
        self.connections = Connections() if on_idle is not None else None
        self._handoff = threading.Condition()
        #: Accepted connections handed to idle threads, and how many threads wait.
        self._handed: list[socket.socket] = []
        self._idle = 0

    def _hand_over(self, sock: socket.socket) -> bool:
        """Give ``sock`` to an idle connection thread; False when none waits."""
        with self._handoff:
            if self._idle <= len(self._handed):
                return False
            self._handed.append(sock)
            self._handoff.notify()
            return True

    def _serve(self, sock: socket.socket) -> None:
        """A connection thread: serve ``sock``, then whatever is handed over."""
        while True:
            serve_connection(sock, self.handler, self.refuse, self.connections)
            with self._handoff:
                if self._idle >= IDLE_THREADS:
                    return
                self._idle += 1
                while not self._handed:
                    self._handoff.wait()
                sock = self._handed.pop()
                self._idle -= 1

    def serve_forever(self) -> None:
        timeout = _timeval(IDLE_TIMEOUT_SECONDS)
        spare = _Spare(self.handler, self.refuse, self.connections)
        spare.start()
        tcp = self.listener.family in (socket.AF_INET, socket.AF_INET6)
        on_idle, connections = self.on_idle, self.connections
        waiting = select.poll()
        waiting.register(self.listener, select.POLLIN)
        parkable = self.reopen is not None
        if parkable:
            waiting.register(self._wake_r, select.POLLIN)
        while True:
            if parkable or (on_idle and connections):
                events = waiting.poll(self.idle_poll_ms if on_idle and connections else None)
                if not events and on_idle and connections:
                    on_idle(connections)
                    continue
                if any(fd == self._wake_r for fd, _ in events):
                    os.read(self._wake_r, 64)
                    waiting.unregister(self.listener)
                    self._park()
                    waiting.register(self.listener, select.POLLIN)
                    continue
            try:
                sock, _ = self.listener.accept()
            except (ConnectionAbortedError, InterruptedError):
                continue
            except OSError as exc:
                if exc.errno in (23, 24):  # ENFILE, EMFILE: wait for fds to free up
                    threading.Event().wait(0.1)
                    continue
                raise
            if parkable:
                self._accepted = {s for s in self._accepted if s.fileno() != -1}
                self._accepted.add(sock)
            # A blocking socket with a kernel receive timeout: no poll per recv.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, timeout)
            if tcp:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if connections is not None:
                # Known as open before this thread can next call on_idle.
                connections.opened(sock)
            if self._hand_over(sock):
                continue
            thread = threading.Thread(
                target=self._serve, name="http-conn", args=(sock,), daemon=True
            )
            try:
                thread.start()
            except RuntimeError:
                # No thread to be had (the sandbox's pids limit, a fork bomb): the
                # spare serves it, or, when busy, drop it but stay up; the next
                # may find room.
                if not spare.offer(sock):
                    if connections is not None:
                        connections.closed(sock)
                    sock.close()
                    threading.Event().wait(0.05)

    def park(self) -> bool:
        """Ask the accepting thread to park (:mod:`.park`); False when this
        server cannot. Returns at once: the connection that asked is shut too."""
        if self.reopen is None:
            return False
        os.write(self._wake_w, b"p")
        return True

    def _park(self) -> None:
        """Close the listener and every connection, wait until each thread closed
        its own (then no socket of the host's is left in the sandbox), and serve
        on the listener :attr:`reopen` returns once the sandbox runs again."""
        assert self.reopen is not None
        self.listener.close()
        for sock in self._accepted:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        for _ in range(PARK_CLOSE_POLLS):
            if all(sock.fileno() == -1 for sock in self._accepted):
                break
            threading.Event().wait(0.01)
        self._accepted.clear()
        print("podbay-agent: parked for a checkpoint", file=sys.stderr, flush=True)
        self.listener = self.reopen()
        print("podbay-agent: serving again after a restore", file=sys.stderr, flush=True)


#: How many 10 ms waits a park gives connection threads to close their sockets
#: (a thread writing a large answer notices the shutdown at its next send).
PARK_CLOSE_POLLS = 500


def _timeval(seconds: int) -> bytes:
    """A ``struct timeval`` for ``SO_RCVTIMEO``."""
    return struct.pack("@ll", seconds, 0)
