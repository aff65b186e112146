"""``podbay sandbox exec NAME [--cwd D] [--env K=V]... [--timeout-ms N] [--user U]
[--no-stdin] -- ARGV``, the quick way: the standard library only, no click, no httpx, no SDK.

A shell user or script runs this command more than any other, and almost
all of its time went to Python start-up and imports (httpx and the SDK
most, then click, then ``http.client`` and the email package it loads; see
docs/performance.md), not to the two requests it makes. This path makes those
two requests (attach, exec) with a socket and the little HTTP/1.1 two JSON
requests need, and prints what the full command prints. It loads neither
``json`` nor ``socket`` (:mod:`podbay.wire.quickjson`, :func:`connect`):
between them they load ``re``, ``enum``, ``functools``, ``collections`` and
``selectors``, a noticeable share of a start on a loaded machine.

It hands over to the full command (by answering ``None``) whenever the
full command would do something it does not, always before the command
could have run: any other option (``--json``, ``--help``), no ``--``
before the argv, an HTTPS server (the SDK's certificate store is not the
standard library's), an attach that is not a plain 200 (202 while the
environment is prepared, refusals, transport failures: the full command
attaches again, which is idempotent, and reports them), and an exec
refused 401, 403 or 503 (answered before anything ran; the SDK
re-attaches or waits and repeats). Once the exec request is sent, every
outcome is reported here, as the full command would: output, notes, its
exit code; a refusal as ``podbay: <status> <CODE>: <message>`` (exit 1, or
127/126 for a command that could not start);
no answer as ``podbay: unavailable: ...`` (exit 2; never retried).

A standard input that is not a terminal (nor ``/dev/null``) is passed to the
command, streamed in a chunked request body (:func:`local_stdin`), unless
``--no-stdin``.
"""

from __future__ import annotations

import _socket
import os
import sys

from podbay import __version__
from podbay.client._config import (
    DEFAULT_TIMEOUT_SECONDS,
    TOKEN_ENV,
    exec_timeout_ms,
    token_issuer,
)
from podbay.wire.limits import DEFAULT_SANDBOX_CLASS, is_valid_sandbox_name
from podbay.wire.paths import EXEC, EXEC_STDIN_CONTENT_TYPE, SANDBOXES
from podbay.wire.quickjson import dumps, loads

TYPE_CHECKING = False  # importing typing slows every CLI start; mypy reads this name
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any, TextIO

SERVER_ENV = "PODBAY_SERVER_URL"
TRUNCATED_NOTE = "podbay: output was cut at 1 MiB per stream (use run for more)"
TIMED_OUT_NOTE = "podbay: the command was killed at its deadline"
#: Options this path understands; any other hands over to the full command.
_VALUE_OPTIONS = ("--cwd", "--env", "--timeout-ms", "--token", "--server", "--user")
#: Stdin is sent in chunks of at most this many bytes.
STDIN_CHUNK = 1024 * 1024
#: Data-plane refusals answered before anything ran, that the SDK handles by repeating.
_REPEATABLE = (401, 403, 503)
#: Largest answer head, and answer body, this path reads.
_MAX_HEAD = 64 * 1024
_MAX_BODY = 64 * 1024 * 1024


# Its parameter list is alike in shape to the client's write_file_bytes by
# coincidence only (a few typed values, then keyword options).
def print_exec_result(
    stdout: str,
    stderr: str,
    truncated: bool,
    timed_out: bool,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> None:
    """An exec's output as ``podbay sandbox exec`` prints it (both paths use this)."""
    out = out or sys.stdout
    err = err or sys.stderr
    out.write(stdout)
    out.flush()
    if stderr:
        err.write(stderr)
        err.flush()
    for note, present in ((TRUNCATED_NOTE, truncated), (TIMED_OUT_NOTE, timed_out)):
        if present:
            err.write(note + "\n")
            err.flush()


def local_stdin() -> int | None:
    """fd 0 when it is something to pass to the command: not a terminal (the
    command's input is then typed, which is ``shell``'s job), not ``/dev/null``
    and not closed. None otherwise.

    A pipe that is never closed keeps the command waiting for the end of its
    input, as with ``ssh`` and ``docker exec -i``: ``--no-stdin`` is for that.
    """
    try:
        st = os.fstat(0)
        if os.isatty(0):
            return None
        null = os.stat(os.devnull)
    except OSError:
        return None
    if (st.st_dev, st.st_ino) == (null.st_dev, null.st_ino) or st.st_rdev == null.st_rdev != 0:
        return None
    return 0


def parse(args: Sequence[str]) -> dict[str, Any] | None:
    """The invocation after ``sandbox exec``, or None when it is not one this path takes.

    >>> parse(["box", "--cwd", "/tmp", "--env=A=1", "--", "ls", "-l"])["argv"]
    ['ls', '-l']
    >>> parse(["box", "--json", "--", "true"]) is None
    True
    """
    if not args or args[0].startswith("-"):
        return None
    found: dict[str, Any] = {"name": args[0], "env": {}}
    i = 1
    while i < len(args):
        arg = args[i]
        if arg == "--":
            found["argv"] = list(args[i + 1 :])
            break
        if arg == "--no-stdin":
            found["no_stdin"] = True
            i += 1
            continue
        key, eq, value = arg.partition("=")
        if key not in _VALUE_OPTIONS:
            return None
        if not eq:
            if i + 1 >= len(args):
                return None
            value = args[i + 1]
            i += 1
        i += 1
        if key == "--env":
            env_key, sep, env_value = value.partition("=")
            if not sep or not env_key:
                return None
            found["env"][env_key] = env_value
        elif key == "--timeout-ms":
            try:
                found["timeout_ms"] = int(value)
            except ValueError:
                return None
        else:
            found[key[2:]] = value
    if not found.get("argv"):
        return None
    return found


def split_url(url: str) -> tuple[str, int, str] | None:
    """``(host, port, target)`` of a plain ``http://`` URL; None for anything else.

    >>> split_url("http://127.0.0.1:8700/gw/sb_1/v1/exec")
    ('127.0.0.1', 8700, '/gw/sb_1/v1/exec')
    >>> split_url("https://cp/x") is None, split_url("http://[::1]/")
    (True, ('::1', 80, '/'))
    """
    if not url.startswith("http://"):
        return None
    authority, slash, path = url[len("http://") :].partition("/")
    if "@" in authority or any(c in url for c in " \r\n\t"):
        return None
    host, port = authority, "80"
    if authority.startswith("["):
        host, bracket, rest = authority[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            return None
        port = rest[1:] or "80"
    elif ":" in authority:
        host, _, port = authority.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        return None
    return host, int(port), slash + path if slash else "/"


class _Connections:
    """Kept-alive HTTP/1.1 connections, one per host and port, for JSON requests."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self.open: dict[tuple[str, int], _socket.socket] = {}

    def request(
        self, method: str, url: str, headers: dict[str, str], body: bytes, then: int | None = None
    ) -> tuple[int, str, bytes] | None:
        """(status, reason, body); None for a URL or header this path does not send.
        ``then``: an fd whose bytes follow ``body`` until its end (sent chunked).
        Raises OSError (no answer) or ValueError (an answer this path cannot read)."""
        where = split_url(url)
        if where is None:
            return None
        host, port, target = where
        authority = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        framing = f"Content-Length: {len(body)}" if then is None else "Transfer-Encoding: chunked"
        lines = [f"{method} {target} HTTP/1.1", f"Host: {authority}", framing, "Accept: */*"]
        for key, value in headers.items():
            if not isinstance(value, str) or any(c in key + value for c in "\r\n\0"):
                return None
            lines.append(f"{key}: {value}")
        try:
            head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        except UnicodeEncodeError:
            return None
        sock = self.open.get((host, port))
        if sock is None:
            sock = connect(host, port, self.timeout)
            sock.setsockopt(_socket.IPPROTO_TCP, _socket.TCP_NODELAY, 1)
            self.open[(host, port)] = sock
        if then is None:
            sock.sendall(head + body)
        else:
            sock.sendall(head + b"%x\r\n%b\r\n" % (len(body), body))
            while chunk := os.read(then, STDIN_CHUNK):
                sock.sendall(b"%x\r\n%b\r\n" % (len(chunk), chunk))
            sock.sendall(b"0\r\n\r\n")
        status, reason, answer, keep = _read_answer(sock)
        if not keep:
            self.open.pop((host, port)).close()
        return status, reason, answer

    def close(self) -> None:
        for sock in self.open.values():
            sock.close()


def connect(host: str, port: int, timeout: float) -> _socket.socket:
    """``socket.create_connection((host, port), timeout)``, with the C module
    alone: the ``socket`` module loads ``enum`` and ``selectors`` to start.
    Each address in turn; the last one's error when none connects."""
    error: OSError = OSError("getaddrinfo returns an empty list")
    for family, kind, proto, _, address in _socket.getaddrinfo(
        _lookup_name(host), port, 0, _socket.SOCK_STREAM
    ):
        try:
            sock = _socket.socket(family, kind, proto)
        except OSError as exc:
            error = exc
            continue
        try:
            sock.settimeout(timeout)
            sock.connect(address)
        except OSError as exc:
            sock.close()
            error = exc
            continue
        return sock
    raise error


def _lookup_name(host: str) -> str | bytes:
    """``host`` as ``getaddrinfo`` receives it: ASCII bytes, which is what the
    ``idna`` codec makes of a ``str`` whose labels are 1 to 63 characters (the
    last may be empty), without loading the codec (and ``unicodedata``).
    Anything else stays a ``str``, for the codec to encode or refuse.

    >>> _lookup_name("127.0.0.1"), _lookup_name("cp.example."), _lookup_name("a..b")
    (b'127.0.0.1', b'cp.example.', 'a..b')
    """
    if host.isascii():
        *labels, last = host.split(".")
        if all(0 < len(label) < 64 for label in labels) and len(last) < 64:
            return host.encode()
    return host


class _Reader:
    def __init__(self, sock: _socket.socket) -> None:
        self.sock = sock
        self.buf = b""

    def more(self) -> bool:
        data = self.sock.recv(65536)
        self.buf += data
        return bool(data)

    def until(self, mark: bytes, limit: int) -> bytes:
        while (end := self.buf.find(mark)) < 0:
            if len(self.buf) > limit:
                raise ValueError("answer head too large")
            if not self.more():
                raise ConnectionError("the server closed the connection mid-answer")
        data, self.buf = self.buf[:end], self.buf[end + len(mark) :]
        return data

    def exactly(self, n: int) -> bytes:
        if n > _MAX_BODY:
            raise ValueError("answer body too large")
        while len(self.buf) < n:
            if not self.more():
                raise ConnectionError("the server closed the connection mid-answer")
        data, self.buf = self.buf[:n], self.buf[n:]
        return data


def _read_answer(sock: _socket.socket) -> tuple[int, str, bytes, bool]:
    """One HTTP/1.1 answer: status, reason, body, whether the connection stays open."""
    reader = _Reader(sock)
    head = reader.until(b"\r\n\r\n", _MAX_HEAD).decode("latin-1").split("\r\n")
    version, _, rest = head[0].partition(" ")
    code, _, reason = rest.partition(" ")
    if not version.startswith("HTTP/1.") or len(code) != 3 or not code.isdigit():
        raise ValueError(f"not an HTTP/1.1 status line: {head[0][:80]!r}")
    fields: dict[str, str] = {}
    for line in head[1:]:
        name, colon, value = line.partition(":")
        if not colon:
            raise ValueError("malformed header line in the answer")
        fields[name.strip().lower()] = value.strip()
    status = int(code)
    keep = version == "HTTP/1.1" and "close" not in fields.get("connection", "").lower()
    if "chunked" in fields.get("transfer-encoding", "").lower():
        parts = []
        while size := int(reader.until(b"\r\n", 1024).split(b";")[0] or b"x", 16):
            parts.append(reader.exactly(size))
            reader.exactly(2)
        while reader.until(b"\r\n", _MAX_HEAD):  # trailers
            pass
        return status, reason, b"".join(parts), keep
    if "content-length" in fields:
        return status, reason, reader.exactly(int(fields["content-length"])), keep
    if status in (204, 304) or status < 200:
        return status, reason, b"", keep
    while reader.more():  # no length: the body ends with the connection
        if len(reader.buf) > _MAX_BODY:
            raise ValueError("answer body too large")
    return status, reason, reader.buf, False


def _refused(status: int, reason: str, raw: bytes) -> int:
    """Report the exec's refusal in the SDK's sentence (both are
    ``refusal_error``); the full command's exit code for it (127 or 126 for a
    command that could not start, as in a shell; else 1)."""
    from podbay.errors import refusal_error, shell_exit_code  # here: only a refusal needs it

    error = refusal_error(status, raw, reason)
    _fail(str(error))
    return shell_exit_code(error) or 1


def run(args: Sequence[str], environ: dict[str, str] | None = None) -> int | None:
    """Run the invocation and return its exit status; None to hand it to the full command."""
    call = parse(args)
    if call is None:
        return None
    env = os.environ if environ is None else environ
    token = call.get("token") or env.get(TOKEN_ENV)
    if not token:
        return None
    try:
        server = (call.get("server") or env.get(SERVER_ENV) or token_issuer(token)).rstrip("/")
    except ValueError:
        return None
    if not server.startswith("http://"):
        return None
    agent = f"podbay-python/{__version__}"
    connections = _Connections(DEFAULT_TIMEOUT_SECONDS)
    try:
        try:
            if not is_valid_sandbox_name(call["name"]):
                return None  # the full command reports the server's refusal
            # A valid name's only character a path segment must escape is ":".
            attached = connections.request(
                "PUT",
                f"{server}{SANDBOXES}/{call['name'].replace(':', '%3A')}",
                {
                    "Authorization": f"Bearer {token}",
                    "User-Agent": agent,
                    "Content-Type": "application/json",
                },
                dumps({"class": DEFAULT_SANDBOX_CLASS}).encode(),
            )
            if attached is None or attached[0] not in (200, 201):
                return None
            raw = attached[2]
            handle = loads(raw)
            endpoint, headers = handle["endpoint"], handle["headers"]
            if not isinstance(endpoint, str) or not isinstance(headers, dict):
                return None
        except (OSError, ValueError, KeyError, TypeError):
            return None
        body: dict[str, Any] = {"command": call["argv"]}
        if call.get("cwd") is not None:
            body["cwd"] = call["cwd"]
        if call["env"]:
            body["env"] = call["env"]
        body["timeout_ms"] = exec_timeout_ms(DEFAULT_TIMEOUT_SECONDS, call.get("timeout_ms"))
        if call.get("user") is not None:
            body["user"] = call["user"]
        url = endpoint.rstrip("/") + EXEC
        stdin = None if call.get("no_stdin") else local_stdin()
        try:
            if stdin is None:
                answered = connections.request(
                    "POST",
                    url,
                    {"User-Agent": agent, **headers, "Content-Type": "application/json"},
                    dumps(body).encode(),
                )
            else:
                # The request line, then stdin: once sent, it cannot be sent again,
                # so every answer (401/403 too) is reported here.
                answered = connections.request(
                    "POST",
                    url,
                    {"User-Agent": agent, **headers, "Content-Type": EXEC_STDIN_CONTENT_TYPE},
                    dumps(body).encode() + b"\n",
                    then=stdin,
                )
                if answered is not None and answered[0] in _REPEATABLE:
                    return _refused(*answered)
        except (OSError, ValueError) as exc:
            kind = type(exc).__name__
            _fail(f"unavailable: POST {url.split('?', 1)[0]} failed: {kind}: {exc or kind}")
            return 2
        if answered is None or answered[0] in _REPEATABLE:
            return None
        status, reason, raw = answered
        if status != 200:
            return _refused(status, reason, raw)
        try:
            result = loads(raw)
            code = int(result["exit_code"])
            stdout, stderr = str(result.get("stdout", "")), str(result.get("stderr", ""))
        except (ValueError, KeyError, TypeError) as exc:
            from podbay.errors import request_error

            _fail(
                str(
                    request_error(
                        200, f"unexpected answer from POST {url}: {exc}", "RESPONSE_INVALID"
                    )
                )
            )
            return 1
        print_exec_result(
            stdout, stderr, bool(result.get("truncated")), bool(result.get("timed_out"))
        )
        return code
    except KeyboardInterrupt:
        _fail("interrupted")
        return 130
    finally:
        connections.close()


def _fail(message: str) -> None:
    sys.stderr.write(f"podbay: {message}\n")
    sys.stderr.flush()
