"""How podbay's answers become envd's messages (podbay.e2b.filesystem,
podbay.e2b.processes, podbay.e2b.relay): entries, pids, spawn requests and
refusals."""

from __future__ import annotations

import json
from typing import Any

import pytest
from starlette.requests import Request

from podbay.e2b import connect, filesystem, keys, processes, relay
from podbay.e2b import pty as podbay_pty


def _request(authorization: str | None = None) -> Request:
    headers = [] if authorization is None else [(b"authorization", authorization.encode())]
    return Request({"type": "http", "method": "POST", "path": "/", "headers": headers})


def test_entry_is_envds_entry_info() -> None:
    info = {
        "name": "a.txt",
        "path": "/tmp/a.txt",
        "type": "file",
        "size": 5,
        "mode": 0o644,
        "mtime": "2026-12-02T01:00:00.000Z",
        "uid": 1000,
        "gid": 1000,
        "owner": "user",
    }
    assert filesystem.entry(info) == {
        "name": "a.txt",
        "type": "FILE_TYPE_FILE",
        "path": "/tmp/a.txt",
        "size": "5",
        "mode": 0o644,
        "permissions": "-rw-r--r--",
        "modifiedTime": "2026-12-02T01:00:00.000Z",
        "owner": "user",
        "group": "1000",
    }
    directory = filesystem.entry({**info, "type": "directory", "mode": 0o755, "owner": None})
    assert directory["permissions"] == "drwxr-xr-x"
    assert "owner" not in directory
    assert filesystem.entry({**info, "type": "other"})["type"] == "FILE_TYPE_UNSPECIFIED"


def test_pid_is_the_process_ids_first_8_hex_digits() -> None:
    assert processes.pid_of("00000001ff") == 1
    assert processes.pid_of("ffffffff00") == 2**32 - 1


def test_spawn_body_merges_envs_and_keeps_what_list_reports() -> None:
    message = {
        "process": {"cmd": "/bin/bash", "args": ["-c", "x"], "envs": {"A": "2"}, "cwd": "/tmp"},
        "tag": "t",
        "stdin": True,
    }
    body, meta = processes._spawn_body(message, {"A": "1", "B": "1"}, _request("Basic dXNlcjo="))
    assert body == {
        "command": ["/bin/bash", "-c", "x"],
        "env": {"A": "2", "B": "1"},
        "stdin": True,
        "cwd": "/tmp",
        "user": "user",
    }
    assert (meta.tag, meta.cmd, meta.args, meta.envs, meta.cwd) == (
        "t",
        "/bin/bash",
        ["-c", "x"],
        {"A": "2"},
        "/tmp",
    )


@pytest.mark.parametrize(
    ("message", "code"),
    [
        ({}, "invalid_argument"),
        ({"process": {"cmd": 1}}, "invalid_argument"),
        ({"process": {"cmd": "x", "args": [1]}}, "invalid_argument"),
        ({"process": {"cmd": "x", "envs": {"A": 1}}}, "invalid_argument"),
        ({"process": {"cmd": "x", "cwd": 5}}, "invalid_argument"),
        ({"process": {"cmd": "x"}, "tag": 5}, "invalid_argument"),
    ],
)
def test_bad_start_messages(message: dict[str, Any], code: str) -> None:
    with pytest.raises(connect.ConnectError) as refused:
        processes._spawn_body(message, {}, _request())
    assert refused.value.code == code


@pytest.mark.parametrize(
    ("status", "body", "code"),
    [
        (404, {"error": "gone", "code": "PATH_NOT_FOUND"}, "not_found"),
        (409, {"error": "there", "code": "PATH_EXISTS"}, "already_exists"),
        (409, {"error": "no", "code": "PATH_ACCESS_DENIED"}, "permission_denied"),
        (409, {"error": "closed", "code": "PROCESS_STDIN_CLOSED"}, "failed_precondition"),
        (429, {"error": "full", "code": "PROCESS_LIMIT_REACHED"}, "resource_exhausted"),
        (502, {"error": "down", "code": "X"}, "unavailable"),
    ],
)
def test_refusals_become_connect_codes(status: int, body: dict[str, str], code: str) -> None:
    error = relay.refusal(status, json.dumps(body).encode())
    assert (error.code, error.message) == (code, body["error"])


@pytest.mark.parametrize(
    "pty",
    [None, {}, {"size": {"rows": 0, "cols": 80}}, {"size": {"rows": 24, "cols": 10_001}}],
)
def test_bad_pty_sizes(pty: Any) -> None:
    with pytest.raises(connect.ConnectError) as refused:
        podbay_pty._size({"pty": pty})
    assert refused.value.code == "invalid_argument"


def test_stdin_input_is_base64_and_pty_input_is_a_terminals() -> None:
    assert processes._stdin_bytes({"stdin": "aGk="}) == b"hi"
    for bad, code in [(None, "invalid_argument"), ({"stdin": "!"}, "invalid_argument")]:
        with pytest.raises(connect.ConnectError) as refused:
            processes._stdin_bytes(bad)
        assert refused.value.code == code
    with pytest.raises(connect.ConnectError) as pty:
        processes._stdin_bytes({"pty": "aGk="})  # a command without a terminal
    assert pty.value.code == "invalid_argument"


def test_no_user_is_e2bs_default_user_in_its_home() -> None:
    assert relay.user_of(_request()) == "user"
    assert relay.user_of(_request("Basic cm9vdDo=")) == "root"
    assert relay.in_home("user", "a/b.txt") == "/home/user/a/b.txt"
    assert relay.in_home("root", "x") == "/root/x"
    assert relay.in_home("user", "/tmp/x") == "/tmp/x"
    assert relay.in_home("other", "x") == "x"  # the agent's default directory


@pytest.mark.parametrize("seconds", [None, 100])
@pytest.mark.parametrize("user", [None, "root"])
def test_file_signatures_are_the_sdks(seconds: int | None, user: str | None) -> None:
    signature = pytest.importorskip("e2b.sandbox.signature")
    made = signature.get_signature("/tmp/a b", "write", user, "tok", seconds)
    mine = keys.file_signature("/tmp/a b", "write", user or "", "tok", made["expiration"])
    assert mine == made["signature"]
