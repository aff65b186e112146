"""Beyond the reference, against a real agent: stdin, output options, live
output, files operations and an exec ended by its client leaving."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

from agent_harness import Agent, gone

from podbay.wire.paths import EXEC_STDIN_CONTENT_TYPE, EXEC_STREAM_CONTENT_TYPE

MIB = 1024 * 1024


def _stdin_body(request: dict[str, object], data: Iterator[bytes]) -> Iterator[bytes]:
    yield json.dumps(request).encode() + b"\n"
    yield from data


def test_exec_stdin_streams_binary_through(agent: Agent) -> None:
    block = os.urandom(MIB)
    digest = hashlib.sha256()
    for _ in range(50):
        digest.update(block)
    resp = agent.client.post(
        "/v1/exec",
        headers={"Content-Type": EXEC_STDIN_CONTENT_TYPE},
        content=_stdin_body({"command": ["sha256sum"]}, iter([block] * 50)),
    )
    assert resp.status_code == 200, resp.text
    body = resp.json()
    assert body["exit_code"] == 0
    assert body["stdout"].split()[0] == digest.hexdigest()
    assert (body["stdout_dropped"], body["stderr_dropped"]) == (0, 0)


def test_exec_stdin_ignored_by_the_command_is_discarded(agent: Agent) -> None:
    resp = agent.client.post(
        "/v1/exec",
        headers={"Content-Type": EXEC_STDIN_CONTENT_TYPE},
        content=_stdin_body({"command": ["head", "-c", "3"]}, iter([b"abcdef" * MIB])),
    )
    assert resp.json()["stdout"] == "abc"
    # The connection is still good for the next request.
    assert agent.exec(["echo", "next"]).json()["stdout"] == "next\n"


def test_exec_stdin_body_needs_its_request_line(agent: Agent) -> None:
    resp = agent.client.post(
        "/v1/exec",
        headers={"Content-Type": EXEC_STDIN_CONTENT_TYPE},
        content=b'{"command": ["cat"]}',
    )
    assert resp.status_code == 400
    assert resp.json()["code"] == "REQUEST_INVALID"


def test_spawned_process_stdin_written_many_times_then_closed(agent: Agent) -> None:
    pid = agent.spawn(["cat"], stdin=True).json()["process_id"]
    for part in (b"one ", b"two ", b"three"):
        resp = agent.client.post(f"/v1/processes/{pid}/stdin", content=part)
        assert resp.status_code == 204, resp.text
    resp = agent.client.post(f"/v1/processes/{pid}/stdin", params={"close": "true"}, content=b"!")
    assert resp.status_code == 204
    agent.wait_exited(pid)
    out = agent.client.get(f"/v1/processes/{pid}").json()
    assert out["stdout"] == "one two three!"
    assert out["exit_code"] == 0
    again = agent.client.post(f"/v1/processes/{pid}/stdin", content=b"late")
    assert again.status_code == 409
    assert again.json()["code"] == "PROCESS_STDIN_CLOSED"
    agent.client.delete(f"/v1/processes/{pid}")


def test_spawn_without_stdin_has_none(agent: Agent) -> None:
    pid = agent.spawn(["cat"]).json()["process_id"]
    resp = agent.client.post(f"/v1/processes/{pid}/stdin", content=b"x")
    assert resp.status_code == 409
    assert resp.json()["code"] == "PROCESS_STDIN_CLOSED"
    agent.wait_exited(pid)  # /dev/null: cat ends at once
    agent.client.delete(f"/v1/processes/{pid}")


def test_reference_exec_answer_has_no_new_fields(agent: Agent) -> None:
    assert set(agent.exec(["true"]).json()) == {
        "exit_code",
        "stdout",
        "stderr",
        "duration_ms",
        "timed_out",
        "truncated",
    }


def test_tail_kept_10_mib_output(agent: Agent) -> None:
    script = "import sys; sys.stdout.write('a' * (10 * 2**20 - 3) + 'END')"
    resp = agent.exec(["python3", "-c", script], keep="tail")
    body = resp.json()
    assert body["truncated"] is True
    assert len(body["stdout"]) == MIB
    assert body["stdout"].endswith("aEND")
    assert body["stdout_dropped"] == 10 * MIB - MIB


def test_head_tail_with_marker_and_own_cap(agent: Agent) -> None:
    resp = agent.exec(
        ["python3", "-c", "print('x' * 100, end=''); print('y' * 100, end='')"],
        keep="head_tail",
        max_output_bytes=20,
    )
    body = resp.json()
    assert body["stdout"] == "x" * 10 + "\n[... 180 bytes dropped ...]\n" + "y" * 10
    assert body["stdout_dropped"] == 180
    assert body["truncated"] is True


def test_bytes_output_is_base64_and_exact(agent: Agent) -> None:
    resp = agent.exec(
        ["python3", "-c", "import sys; sys.stdout.buffer.write(bytes(range(256)))"],
        output_encoding="base64",
    )
    assert base64.b64decode(resp.json()["stdout"]) == bytes(range(256))


def test_cap_over_the_server_maximum_is_refused(agent: Agent) -> None:
    resp = agent.exec(["true"], max_output_bytes=1 << 40)
    assert resp.status_code == 400
    assert resp.json()["code"] == "REQUEST_INVALID"


def test_poll_waits_for_output(agent: Agent) -> None:
    pid = agent.spawn(["sh", "-c", "sleep 0.3; echo late; sleep 30"]).json()["process_id"]
    started = time.monotonic()
    out = agent.client.get(f"/v1/processes/{pid}", params={"wait_ms": 10_000}).json()
    assert out["stdout"] == "late\n"
    assert time.monotonic() - started < 9  # woke on the output, not at the bound
    agent.client.delete(f"/v1/processes/{pid}")


def test_poll_wait_ends_at_exit(agent: Agent) -> None:
    pid = agent.spawn(["sleep", "0.2"]).json()["process_id"]
    out = agent.client.get(f"/v1/processes/{pid}", params={"wait_ms": 10_000}).json()
    assert out["state"] == "exited"
    assert out["exit_code"] == 0
    agent.client.delete(f"/v1/processes/{pid}")


def test_poll_bytes(agent: Agent) -> None:
    pid = agent.spawn(["printf", "\\377\\000a"]).json()["process_id"]
    agent.wait_exited(pid)
    out = agent.client.get(f"/v1/processes/{pid}", params={"encoding": "base64"}).json()
    assert base64.b64decode(out["stdout"]) == b"\xff\x00a"
    assert out["stdout_next"] == 3
    agent.client.delete(f"/v1/processes/{pid}")


def test_streamed_exec_sends_output_as_written(agent: Agent) -> None:
    command = ["sh", "-c", "echo first; sleep 1; echo second >&2; exit 3"]
    with agent.client.stream(
        "POST", "/v1/exec", json={"command": command}, headers={"Accept": EXEC_STREAM_CONTENT_TYPE}
    ) as resp:
        assert resp.headers["content-type"] == EXEC_STREAM_CONTENT_TYPE
        lines = resp.iter_lines()
        first = json.loads(next(lines))
        first_at = time.monotonic()
        rest = [json.loads(line) for line in lines]
        ended_at = time.monotonic()
    assert first == {"stdout": "first\n"}
    assert rest[0] == {"stderr": "second\n"}
    assert rest[-1]["result"]["exit_code"] == 3
    assert ended_at - first_at > 0.5  # the first line came before the sleep ended


def test_exec_killed_when_its_client_leaves(agent: Agent, tmp_path: Path) -> None:
    marker = tmp_path / "pid"
    body = json.dumps({"command": ["sh", "-c", f"echo $$ > {marker}; exec sleep 300"]}).encode()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(agent.sock_path)
        sock.sendall(
            b"POST /v1/exec HTTP/1.1\r\nHost: a\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        deadline = time.monotonic() + 10
        while not marker.exists() or not marker.read_text().strip():
            assert time.monotonic() < deadline
            time.sleep(0.02)
    assert gone(int(marker.read_text()), within=10)


def test_chmod_move_and_owner(agent: Agent, workspace: Path) -> None:
    rel = workspace.name
    (workspace / "a.txt").write_text("hi")
    resp = agent.client.post("/v1/files/chmod", json={"path": f"{rel}/a.txt", "mode": 0o600})
    assert resp.status_code == 200
    assert resp.json()["mode"] == 0o600
    resp = agent.client.post(
        "/v1/files/move", json={"source": f"{rel}/a.txt", "destination": f"{rel}/d/b.txt"}
    )
    assert resp.status_code == 200, resp.text
    assert (workspace / "d/b.txt").read_text() == "hi"
    assert not (workspace / "a.txt").exists()
    (workspace / "c.txt").write_text("c")
    resp = agent.client.post(
        "/v1/files/move", json={"source": f"{rel}/c.txt", "destination": f"{rel}/d/b.txt"}
    )
    assert resp.status_code == 409
    assert resp.json()["code"] == "PATH_EXISTS"
    stat = agent.client.get(
        "/v1/files/stat", params={"path": f"{rel}/d/b.txt", "owner": "true"}
    ).json()
    assert (stat["uid"], stat["owner"], stat["size"]) == (0, "root", 2)
    plain = agent.client.get("/v1/files/stat", params={"path": f"{rel}/d/b.txt"}).json()
    assert "owner" not in plain
    assert "uid" not in plain


def test_unknown_user_is_refused(agent: Agent) -> None:
    resp = agent.exec(["true"], user="no-such-user-here")
    assert resp.status_code == 400
    assert resp.json()["code"] == "USER_UNKNOWN"


def test_default_user_header_and_explicit_user(agent: Agent) -> None:
    # The gateway sends the operator's default; a request's own ``user`` wins.
    headers = {"X-Podbay-Default-User": "nobody"}
    resp = agent.client.post("/v1/exec", json={"command": ["id", "-u"]}, headers=headers)
    assert resp.json()["stdout"] == "65534\n"
    resp = agent.client.post(
        "/v1/exec", json={"command": ["id", "-u"], "user": "root"}, headers=headers
    )
    assert resp.json()["stdout"] == "0\n"
    assert agent.exec(["id", "-u"]).json()["stdout"] == "0\n"
