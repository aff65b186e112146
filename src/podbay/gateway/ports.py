"""``/v1/ports/{port}/<path>``: HTTP and WebSocket requests to a server in the sandbox.

Each request gets a tunnel of its own (:mod:`.upgrade`, ``podbay-tunnel``):
the agent connects to ``127.0.0.1:{port}`` inside the sandbox and splices.
Over it the gateway speaks plain HTTP/1.1 with ``Connection: close``
(``Host: localhost:{port}``; ``X-Forwarded-Host``, ``-Proto`` and
``-Prefix`` say how the client reached it); a WebSocket is
:mod:`.portsocket`'s, told the same headers (:func:`websocket_headers`).

What the server in the sandbox answers is hostile input: its head is
bounded in bytes and headers, hop-by-hop headers and ``Set-Cookie`` are
dropped (the endpoint shares the platform's origin; cookies for one
sandbox's app must not be set there), as are the client's credential,
``Authorization`` and cookies on the way in. A ``Location`` is kept only where it
stays in the same sandbox's port (see :func:`_location`), and an answer
whose body ends short of its framing drops the client's connection rather
than pass as whole.
"""

from __future__ import annotations

import logging
from pathlib import Path
from urllib.parse import urljoin, urlsplit

import httptools

from podbay.asgi import Receive, Scope, Send, abort_response
from podbay.errors import AgentAnswerInvalid, ApiError, BodyTooLarge
from podbay.wire import paths
from podbay.wire.codes import ErrorCode

from .proxy import _DROP_REQUEST, _send_request, send_error
from .upgrade import READ_LIMIT, upgrade

log = logging.getLogger("podbay.gateway")

MAX_RESPONSE_HEAD = 64 * 1024
MAX_RESPONSE_HEADERS = 100
_DROP_RESPONSE = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-authenticate",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
        b"set-cookie",
        b"content-length",
        b"location",
    }
)
_DROP_PORT_REQUEST = _DROP_REQUEST | {
    b"x-forwarded-host",
    b"x-forwarded-proto",
    b"x-forwarded-prefix",
    b"sec-websocket-key",
    b"sec-websocket-version",
    b"sec-websocket-extensions",
    b"sec-websocket-protocol",
}
#: Request bodies to a port are bounded only by the server in the sandbox.
_BODY_LIMIT: int | None = None


def parse_target(tail: bytes) -> tuple[int, bytes] | None:
    """``/v1/ports/8080/a/b`` → ``(8080, b"/a/b")``; None when it names no port."""
    rest = tail[len(paths.PORTS) + 1 :]
    raw_port, slash, path = rest.partition(b"/")
    if not raw_port.isdigit() or len(raw_port) > 5 or not 1 <= int(raw_port) <= 65535:
        return None
    return int(raw_port), slash + path if slash else b"/"


def _forwarding(scope: Scope, prefix: str) -> list[tuple[bytes, bytes]]:
    host = next((v for k, v in scope["headers"] if k == b"host"), b"")
    scheme = scope.get("scheme", "http").replace("ws", "http")
    return [
        (b"x-forwarded-host", host),
        (b"x-forwarded-proto", scheme.encode()),
        (b"x-forwarded-prefix", prefix.encode()),
    ]


def _headers_in(scope: Scope) -> list[tuple[bytes, bytes]]:
    return [(k, v) for k, v in scope["headers"] if k not in _DROP_PORT_REQUEST]


def websocket_headers(scope: Scope, prefix: str) -> list[tuple[bytes, bytes]]:
    """What the server on the port is told of a WebSocket's client: as for HTTP."""
    return [*_headers_in(scope), *_forwarding(scope, prefix)]


async def relay_http(
    socket: Path,
    port: int,
    path: bytes,
    prefix: str,
    scope: Scope,
    receive: Receive,
    send: Send,
    request_id: str,
) -> int:
    """Forward one HTTP request to ``port``; returns the status the client got."""
    try:
        reader, writer = await upgrade(
            socket, "GET", f"{paths.TUNNEL}?port={port}", paths.UPGRADE_TUNNEL
        )
    except ApiError as exc:
        await send_error(send, exc, request_id)
        return exc.status
    query = scope.get("query_string") or b""
    target = path + b"?" + query if query else path
    framing = "none"
    lines = [
        scope["method"].encode(),
        b" ",
        target,
        b" HTTP/1.1\r\nhost: localhost:",
        str(port).encode(),
        b"\r\nconnection: close\r\n",
    ]
    for key, value in [*_headers_in(scope), *_forwarding(scope, prefix)]:
        lines += [key, b": ", value, b"\r\n"]
    for key, value in scope["headers"]:
        if key == b"content-length" and value.strip() not in (b"", b"0"):
            framing = "length"
            lines += [b"content-length: ", value, b"\r\n"]
        elif key == b"transfer-encoding" and framing != "length":
            framing = "chunked"
    if framing == "chunked":
        lines.append(b"transfer-encoding: chunked\r\n")
    lines.append(b"\r\n")
    started = False
    try:
        await _send_request(writer, b"".join(lines), framing, receive, _BODY_LIMIT)
        answer = _Answer(scope["method"] == "HEAD")
        parser = answer.parser = httptools.HttpResponseParser(answer)
        head_bytes = 0
        status = 502
        while not answer.done:
            data = await reader.read(READ_LIMIT)
            if not data:
                if not answer.headers_done:
                    raise ConnectionResetError("the server closed the connection")
                if answer.framed():
                    raise ConnectionResetError("the server closed before its body's end")
                answer.done = True  # a body delimited by the connection's end
            else:
                parser.feed_data(data)
                if not answer.headers_done:
                    head_bytes += len(data)
                    if head_bytes > MAX_RESPONSE_HEAD:
                        raise AgentAnswerInvalid("answer head too large")
            if answer.headers_done and not started:
                status = parser.get_status_code()
                if not 200 <= status <= 599:
                    raise AgentAnswerInvalid(f"status {status} is not a final answer")
                headers = [(k, v) for k, v in answer.headers if k not in _DROP_RESPONSE]
                headers += _redirect(answer.headers, port, path, prefix, scope)
                await send({"type": "http.response.start", "status": status, "headers": headers})
                started = True
            chunks, answer.body = answer.body, []
            for chunk in chunks:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        return status
    except ConnectionAbortedError:
        return 499
    except (OSError, httptools.HttpParserError, AgentAnswerInvalid, BodyTooLarge):
        if not started:
            await send_error(
                send,
                ApiError(
                    ErrorCode.PORT_UNREACHABLE,
                    f"the server on port {port} in the sandbox gave no usable answer",
                ),
                request_id,
            )
        else:
            abort_response(scope)  # a short body must not end like a whole one
        return 502
    finally:
        writer.close()


def _redirect(
    headers: list[tuple[bytes, bytes]], port: int, path: bytes, prefix: str, scope: Scope
) -> list[tuple[bytes, bytes]]:
    """The answer's ``Location``, made to point where the client reaches it, or
    nothing when it leads off the sandbox's port (see :func:`_location`)."""
    host = next((v for k, v in scope["headers"] if k == b"host"), b"").decode("latin-1")
    for name, value in headers:
        if name == b"location":
            where = _location(value.decode("latin-1"), port, path.decode("latin-1"), prefix, host)
            return [] if where is None else [(b"location", where.encode("latin-1"))]
    return []


def _location(value: str, port: int, path: str, prefix: str, host: str) -> str | None:
    """A redirect from the server on ``port`` (answering the request for
    ``path``), as the client must follow it; None when it leads elsewhere.

    The answer is served on the platform's origin, so a redirect the server
    meant for its own root (``/login``) would land on the platform's, and
    one to another site would seem the platform's own: paths are resolved
    against the request and put under ``prefix``; a URL is kept only for the
    server itself (``localhost:{port}``, what the gateway called it) or under
    ``prefix`` on the client's host.

    >>> _location("/login?next=a", 8080, "/app/x", "/sandbox/s/v1/ports/8080", "h")
    '/sandbox/s/v1/ports/8080/login?next=a'
    >>> _location("../../../../etc", 8080, "/a/b", "/p", "h")
    '/p/etc'
    >>> _location("http://localhost:8080/x", 8080, "/", "/p", "h")
    '/p/x'
    >>> _location("https://h/p/y", 8080, "/", "/p", "h")
    'https://h/p/y'
    >>> [_location(u, 8080, "/", "/p", "h") for u in ("//evil/x", "https://evil/", "https://h/x")]
    [None, None, None]
    """
    # Browsers read a backslash in a URL as a slash ("/\\evil" is "//evil").
    value = value.strip().replace("\\", "/")
    try:
        parts = urlsplit(value)
    except ValueError:
        return None
    if parts.scheme or parts.netloc:
        if parts.scheme not in ("http", "https"):
            return None
        netloc = parts.netloc.lower()
        if netloc in (f"localhost:{port}", f"127.0.0.1:{port}"):
            value = value[len(parts.scheme) + 3 + len(parts.netloc) :] or "/"
        elif netloc == host.lower() and (
            parts.path == prefix or parts.path.startswith(prefix + "/")
        ):
            return value
        else:
            return None
    # Resolved against the request's path first: no "../" climbs above the port.
    # (Joined on a dummy origin: urljoin resolves dot segments only there.)
    base = "http://upstream"
    return prefix + urljoin(base + (path.split("?", 1)[0] or "/"), value)[len(base) :]


class _Answer:
    def __init__(self, head_only: bool) -> None:
        self.head_only = head_only
        self.headers: list[tuple[bytes, bytes]] = []
        self.headers_done = False
        self.body: list[bytes] = []
        self.done = False
        self.parser: httptools.HttpResponseParser | None = None

    def on_header(self, name: bytes, value: bytes) -> None:
        if len(self.headers) >= MAX_RESPONSE_HEADERS:
            raise AgentAnswerInvalid(f"more than {MAX_RESPONSE_HEADERS} headers")
        self.headers.append((name.lower(), bytes(value)))

    def on_headers_complete(self) -> None:
        self.headers_done = True
        if self.head_only:
            self.done = True

    def framed(self) -> bool:
        """Whether the body has its own end (a length or chunks): the
        connection's end before it is then a cut, not the body's end."""
        return any(name in (b"content-length", b"transfer-encoding") for name, _ in self.headers)

    def on_body(self, body: bytes) -> None:
        self.body.append(bytes(body))

    def on_message_complete(self) -> None:
        self.done = True
