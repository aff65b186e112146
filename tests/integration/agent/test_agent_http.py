"""The HTTP layer under hostile and unusual input, over a raw unix socket."""

from __future__ import annotations

import json
import socket

import pytest
from agent_harness import Agent


def _raw(agent: Agent, data: bytes, timeout: float = 5) -> bytes:
    """Send ``data`` on a new connection and read until the agent closes it."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(agent.sock_path)
        try:
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass  # the agent may close early on garbage; its answer is still readable
        chunks = []
        while True:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            chunks.append(chunk)
    return b"".join(chunks)


def _status_and_code(raw: bytes) -> tuple[int, str]:
    head, _, body = raw.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    return status, json.loads(body)["code"]


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"GET /v1/info HTTP/1.1\r\nX-Big: " + b"a" * 70_000 + b"\r\n\r\n",
        b"GET /v1/info HTTP/1.1\r\n" + b"X-H: 1\r\n" * 200 + b"\r\n",
        b"NOT A REQUEST\r\n\r\n",
        b"GET /v1/info HTTP/2.0\r\n\r\n",
        b"GET http://x/v1/info HTTP/1.1\r\n\r\n",
        b"GET /v1/info HTTP/1.1\r\nbad header\r\n\r\n",
        b"POST /v1/exec HTTP/1.1\r\nContent-Length: -5\r\n\r\n",
        b"POST /v1/exec HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab",
        b"POST /v1/exec HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n",
        b"POST /v1/exec HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"POST /v1/exec HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n" + b"f" * 40 + b"\r\n",
        b"POST /v1/exec HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}XX",
        b"POST /v1/exec HTTP/1.1\r\nContent-Length: 10\r\n\r\n{}",
        b"GET /v1/processes/x?stdout_from=%ff HTTP/1.1\r\n\r\n",
    ],
)
def test_hostile_requests_are_refused_and_the_agent_lives_on(
    agent: Agent, request_bytes: bytes
) -> None:
    raw = _raw(agent, request_bytes)
    status, code = _status_and_code(raw)
    assert status == 400, raw[:200]
    assert code == "REQUEST_INVALID", raw[:200]
    assert agent.client.get("/v1/info").status_code == 200


def test_unknown_route_and_wrong_method(agent: Agent) -> None:
    resp = agent.client.get("/v2/nothing")
    assert (resp.status_code, resp.json()["code"]) == (404, "ROUTE_NOT_FOUND")
    resp = agent.client.delete("/v1/exec")
    assert (resp.status_code, resp.json()["code"]) == (405, "METHOD_NOT_ALLOWED")
    assert resp.headers["Allow"] == "POST"
    resp = agent.client.get("/v1/processes/a/b/c")
    assert resp.status_code == 404


def test_keep_alive_chunked_body_and_expect_continue(agent: Agent) -> None:
    body = b'{"command": ["echo", "chunked"]}'
    first = (
        b"POST /v1/exec HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n"
        + b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    )
    second = (
        b"POST /v1/exec HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\n"
        b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(body), body)
    )
    raw = _raw(agent, first + second)
    assert raw.count(b"HTTP/1.1 200 OK") == 2
    assert raw.count(b'"stdout":"chunked\\n"') == 2
    assert b"HTTP/1.1 100 Continue" in raw


def test_http_1_0_closes_after_the_answer(agent: Agent) -> None:
    raw = _raw(agent, b"GET /v1/info HTTP/1.0\r\n\r\nGET /v1/info HTTP/1.0\r\n\r\n")
    assert raw.count(b"HTTP/1.1 200 OK") == 1
    assert b"Connection: close" in raw


def test_a_refused_upload_keeps_the_connection_usable(agent: Agent) -> None:
    # No digest: refused before the body is read; the body is drained, not left in the way.
    with agent.new_client() as client:
        resp = client.put("/v1/files", params={"path": "x"}, content=b"z" * 300_000)
        assert resp.json()["code"] == "DIGEST_MISSING"
        assert client.get("/v1/info").status_code == 200
