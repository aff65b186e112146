"""The quick ``sandbox exec`` path: what it takes itself and what it hands over."""

from __future__ import annotations

import errno
import subprocess
import sys

from podbay.cli.quick_exec import parse, run


def test_takes_the_plain_forms() -> None:
    call = parse(
        [
            "box",
            "--cwd",
            "/tmp",
            "--env",
            "A=1",
            "--env=B=x=y",
            "--timeout-ms=50",
            "--token",
            "t",
            "--server=http://s",
            "--",
            "ls",
            "--json",
        ]
    )
    assert call == {
        "name": "box",
        "cwd": "/tmp",
        "env": {"A": "1", "B": "x=y"},
        "timeout_ms": 50,
        "token": "t",
        "server": "http://s",
        "argv": ["ls", "--json"],
    }


def test_hands_over_what_the_full_command_must_judge() -> None:
    for args in (
        ["box", "--json", "--", "true"],
        ["box", "-h"],
        ["box", "true"],
        ["box", "--"],
        ["--cwd", "x", "box", "--", "true"],
        ["box", "--env", "A", "--", "true"],
        ["box", "--timeout-ms", "soon", "--", "true"],
        ["box", "--cwd"],
        [],
    ):
        assert parse(args) is None, args


def test_hands_over_without_a_token_or_to_https() -> None:
    assert run(["box", "--", "true"], environ={}) is None
    assert (
        run(["box", "--server", "https://cp.example", "--token", "t", "--", "true"], environ={})
        is None
    )
    assert run(["box", "--token", "not-a-jwt", "--", "true"], environ={}) is None


#: Modules the quick path does without: the full command's (click, httpx), and
#: the standard library's heavier ones (json loads re, enum, functools and
#: collections; socket loads enum and selectors; importlib loads warnings).
NOT_LOADED = (
    "click",
    "httpx",
    "typing",
    "http.client",
    "urllib.parse",
    "json",
    "re",
    "enum",
    "socket",
    "base64",
    "importlib",
    "podbay.errors",
)


def test_loads_neither_click_nor_httpx_nor_typing() -> None:
    code = (
        "import sys; import podbay.cli.entry, podbay.cli.quick_exec; "
        f"print(sorted(m for m in {NOT_LOADED!r} if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-I", "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"


def test_split_url() -> None:
    from podbay.cli.quick_exec import split_url

    assert split_url("http://cp:8700") == ("cp", 8700, "/")
    assert split_url("http://cp/gw/x?y=1") == ("cp", 80, "/gw/x?y=1")
    assert split_url("http://[::1]:9/v1") == ("::1", 9, "/v1")
    for bad in (
        "https://cp/",
        "ftp://cp",
        "http://u@cp/",
        "http://cp:99999/",
        "http://cp:x/",
        "http://:80/",
        "http://cp/a b",
        "http://[::1/",
        "http://cp/\r\nX: y",
    ):
        assert split_url(bad) is None, bad


def test_reads_length_chunked_and_closing_answers() -> None:
    import socket

    from podbay.cli.quick_exec import _read_answer

    def answer(raw: bytes) -> tuple[int, str, bytes, bool]:
        a, b = socket.socketpair()
        with a, b:
            a.sendall(raw)
            a.shutdown(socket.SHUT_WR)
            return _read_answer(b)

    assert answer(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi") == (200, "OK", b"hi", True)
    assert answer(
        b"HTTP/1.1 404 Not Found\r\nTransfer-Encoding: chunked\r\n\r\n"
        b"3;x=1\r\nabc\r\n2\r\nde\r\n0\r\nT: 1\r\n\r\n"
    ) == (404, "Not Found", b"abcde", True)
    assert answer(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nall of it") == (
        200,
        "OK",
        b"all of it",
        False,
    )
    for bad in (
        b"SSH-2.0\r\n\r\n",
        b"HTTP/1.1 2x0 OK\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nbad\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    ):
        try:
            answer(bad)
        except ValueError:
            continue
        raise AssertionError(bad)
    try:
        answer(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort")
    except ConnectionError:
        pass
    else:
        raise AssertionError("a short body must not pass")


def test_docstring_examples() -> None:
    import doctest

    from podbay.cli import quick_exec

    assert doctest.testmod(quick_exec).failed == 0


def test_host_names_reach_getaddrinfo_as_the_idna_codec_makes_them() -> None:
    from podbay.cli.quick_exec import _lookup_name

    for host in ("127.0.0.1", "::1", "localhost", "cp.example.", "a" * 63, "a" * 64, "x.", "."):
        for name in (host, f"{host}.b", f"b.{host}", f"{host}..c"):
            try:
                expected: str | bytes = name.encode("idna")
            except UnicodeError:
                expected = name  # left to the codec, which refuses it
            assert _lookup_name(name) == expected, name
    assert _lookup_name("b\u00fccher.example") == "b\u00fccher.example"


def test_connect_is_create_connection() -> None:
    import socket

    from podbay.cli.quick_exec import connect

    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        sock = connect("127.0.0.1", port, 5)
        try:
            assert sock.getpeername() == ("127.0.0.1", port)
            assert sock.gettimeout() == 5
        finally:
            sock.close()
    # Nothing listens now: the same error as the socket module's, for every address.
    for host in ("127.0.0.1", "localhost"):
        errors = []
        for attempt in (connect, lambda h, p, t: socket.create_connection((h, p), t)):
            try:
                attempt(host, port, 5).close()
            except OSError as exc:
                errors.append((type(exc), exc.errno))
        assert errors == [(ConnectionRefusedError, errno.ECONNREFUSED)] * 2, host
