"""What the console's data-plane proxy lets through: paths (no port relay,
no dot segments) and an answer's headers (a hostile sandbox may answer in its
agent's place)."""

from __future__ import annotations

from podbay.console.proxy import _allowed, answer_headers


def test_only_the_consoles_paths_pass() -> None:
    for tail in (
        "/v1/info",
        "/v1/exec",
        "/v1/pty",
        "/v1/files",
        "/v1/files/list",
        "/v1/processes/p1/signal",
    ):
        assert _allowed(tail), tail
    for tail in (
        "/v1/ports/80/",
        "/v1/tunnel",
        "/v1/files/../ports/80/",
        "/v1/files/%2E%2E/ports/80/",
        "/v1/files%2f..%2fports/80/",
        "/v1/files/.",
        "/v1/files\\\\..\\\\ports",
        "/v1/filesx",
        "/",
    ):
        assert not _allowed(tail), tail


def test_an_answers_headers_cannot_reach_the_consoles_origin() -> None:
    hostile = [
        (b"Content-Type", b"text/html"),
        (b"Set-Cookie", b"podbay_session=attacker; Path=/"),
        (b"Content-Disposition", b"inline"),
        (b"Content-Security-Policy", b"script-src *"),
        (b"Refresh", b"0; url=http://evil.example"),
        (b"Link", b"<http://evil.example>; rel=preload"),
        (b"Access-Control-Allow-Origin", b"*"),
        (b"X-Podbay-Sha256", b"ab"),
        (b"Content-Length", b"3"),
    ]
    out = answer_headers(hostile)
    names = [key for key, _ in out]
    for dropped in (b"set-cookie", b"refresh", b"link", b"access-control-allow-origin"):
        assert dropped not in names
    assert (b"content-disposition", b"attachment") in out
    assert names.count(b"content-disposition") == 1
    assert names.count(b"content-security-policy") == 1
    assert (b"content-security-policy", b"default-src 'none'; sandbox") in out
    assert (b"x-content-type-options", b"nosniff") in out
    assert (b"x-podbay-sha256", b"ab") in out
    assert (b"content-length", b"3") in out
    json_answer = answer_headers([(b"content-type", b"application/json")])
    assert b"content-disposition" not in [key for key, _ in json_answer]
