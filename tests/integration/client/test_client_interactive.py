"""Beyond the reference, both faces, over real sandboxes: stdin, users, output
options, live output, files operations and an exec ended by its client leaving."""

from __future__ import annotations

import hashlib
import io
import os
import time
from typing import Any

import httpx
import pytest

from podbay.client import AsyncSandboxClient, SandboxClient, SandboxRequestError

pytestmark = pytest.mark.root

MIB = 1024 * 1024


def _events(client: Any, name: str, command: list[str], on_first: Any = None) -> list[Any]:
    """Every event of ``client.stream``; ``on_first(sync_client)`` runs after the first."""
    if isinstance(client, SandboxClient):
        events = []
        for event in client.stream(name, command):
            events.append(event)
            if on_first is not None and len(events) == 1:
                on_first(client)
        return events
    aclient: AsyncSandboxClient = client._client

    async def collect() -> list[Any]:
        events = []
        async for event in aclient.stream(name, command):
            events.append(event)
            if on_first is not None and len(events) == 1:
                await on_first(aclient)
        return events

    return list(client._portal.call(collect))


def test_exec_stdin_50_mib_binary(client: Any, name: str) -> None:
    data = os.urandom(50 * MIB)
    result = client.exec(name, ["sha256sum"], stdin=io.BytesIO(data))
    assert result.exit_code == 0
    assert result.stdout.split()[0] == hashlib.sha256(data).hexdigest()
    assert client.exec(name, ["cat"], stdin="héllo").stdout == "héllo"


def test_spawned_process_stdin(client: Any, name: str) -> None:
    proc = client.spawn(name, ["cat"], stdin=True)
    client.write_stdin(name, proc.process_id, "one\n")
    client.write_stdin(name, proc.process_id, b"two\n")
    client.close_stdin(name, proc.process_id)
    result = client.poll(name, proc.process_id, wait_ms=5000)
    while result.state != "exited":
        result = client.poll(name, proc.process_id, stdout_from=0, wait_ms=5000)
    assert (result.stdout, result.exit_code) == ("one\ntwo\n", 0)
    with pytest.raises(SandboxRequestError) as info:
        client.write_stdin(name, proc.process_id, "late")
    assert info.value.code == "PROCESS_STDIN_CLOSED"
    client.kill(name, proc.process_id)


def test_users(client: Any, name: str) -> None:
    assert client.exec(name, ["id", "-un"]).stdout == "root\n"  # the default stays root
    who = client.exec(name, ["sh", "-c", 'id -u; id -gn; echo "$HOME"'], user="user")
    assert who.stdout == "1000\nuser\n/home/user\n"
    client.exec(name, ["sh", "-c", "echo secret > /root.txt; chmod 600 /root.txt"])
    denied = client.exec(name, ["cat", "/root.txt"], user="user")
    assert denied.exit_code != 0
    assert "Permission denied" in denied.stderr
    with pytest.raises(SandboxRequestError) as info:
        client.read_file(name, "/root.txt", user="user")
    assert info.value.code == "PATH_ACCESS_DENIED"  # (a failed read is 404, as the reference)
    assert client.read_file(name, "/root.txt") == "secret\n"
    client.write_file(name, "/home/user/mine.txt", "mine", user="user")
    info_ = client.stat(name, "/home/user/mine.txt")
    assert (info_.owner, info_.uid, info_.gid) == ("user", 1000, 1000)
    with pytest.raises(SandboxRequestError) as info:
        client.write_file(name, "/etc/not-yours", "x", user="user")
    assert info.value.code == "PATH_ACCESS_DENIED"
    assert not client.exists(name, "/etc/not-yours")
    proc = client.spawn(name, ["id", "-un"], user="user")
    out = client.poll(name, proc.process_id, wait_ms=5000)
    while out.state != "exited":
        out = client.poll(name, proc.process_id, wait_ms=5000)
    assert out.stdout == "user\n"
    with pytest.raises(SandboxRequestError) as info:
        client.exec(name, ["true"], user="nobody-here")
    assert info.value.code == "USER_UNKNOWN"


def test_output_tail_10_mib_bytes_and_head_tail(client: Any, name: str) -> None:
    script = "import sys; sys.stdout.write('a' * (10 * 2**20 - 4) + 'TAIL')"
    result = client.exec(name, ["python3", "-c", script], keep="tail")
    assert result.truncated
    assert result.stdout_dropped == 9 * MIB
    assert len(result.stdout) == MIB
    assert result.stdout.endswith("aTAIL")
    both = client.exec(
        name,
        ["python3", "-c", "print('x' * 50 + 'y' * 50, end='')"],
        keep="head_tail",
        max_output_bytes=10,
    )
    assert both.stdout == "xxxxx\n[... 90 bytes dropped ...]\nyyyyy"
    raw = client.exec_bytes(name, ["printf", "\\377\\000\\001"])
    assert raw.stdout == b"\xff\x00\x01"
    assert raw.stdout_dropped == 0
    plain = client.exec(name, ["true"])
    assert plain.stdout_dropped is None  # no option asked: the reference's answer


def test_stream_is_live_and_run_returns(client: Any, name: str) -> None:
    flag = "/tmp/stream-go"
    command = [
        "sh",
        "-c",
        f"echo first; while [ ! -e {flag} ]; do sleep 0.01; done; echo second >&2; exit 4",
    ]

    def release(sync: Any) -> Any:
        if isinstance(sync, SandboxClient):
            return sync.write_file(name, flag, "")
        return sync.write_file(name, flag, "")  # a coroutine for the async face

    events = _events(client, name, command, on_first=release)
    # "second" could only be written after the test saw "first": output is live.
    assert events[0].stdout == "first\n"
    assert events[1].stderr == "second\n"
    assert events[-1].result.exit_code == 4
    seen: list[str] = []
    run = client.run(
        name,
        ["sh", "-c", "echo a; sleep 0.2; echo b"],
        on_output=lambda chunk: seen.append(chunk.stdout),
    )
    assert (run.stdout, run.exit_code) == ("a\nb\n", 0)
    assert "".join(seen) == "a\nb\n"


def test_files_operations(client: Any, name: str) -> None:
    client.mkdir(name, "d/e/f")
    assert client.stat(name, "d/e/f").type == "directory"
    client.write_file(name, "d/e/f/x.sh", "echo hi\n")
    client.chmod(name, "d/e/f/x.sh", 0o750)
    info = client.stat(name, "d/e/f/x.sh")
    assert (info.type, info.size, info.mode, info.owner) == ("file", 8, 0o750, "root")
    client.move(name, "d/e/f/x.sh", "g/y.sh")
    assert not client.exists(name, "d/e/f/x.sh")
    assert client.exists(name, "g/y.sh")
    client.write_file(name, "g/z", "z")
    with pytest.raises(SandboxRequestError) as err:
        client.move(name, "g/z", "g/y.sh")
    assert err.value.code == "PATH_EXISTS"
    client.move(name, "g/z", "g/y.sh", overwrite=True)
    assert client.read_file(name, "g/y.sh") == "z"
    with pytest.raises(SandboxRequestError):
        client.remove(name, "d")  # not empty
    client.remove(name, "d", recursive=True)
    assert not client.exists(name, "d")


def test_exec_killed_when_the_client_leaves(client: Any, name: str) -> None:
    handle = client.attach(name)
    pidfile = "/tmp/left.pid"
    body = {"command": ["sh", "-c", f"echo $$ > {pidfile}; exec sleep 600"], "timeout_ms": 600_000}
    with pytest.raises(httpx.ReadTimeout):  # the client gives up and closes its connection
        httpx.post(handle.endpoint + "/v1/exec", json=body, headers=handle.headers, timeout=3)
    pid = client.read_file(name, pidfile).strip()
    deadline = time.monotonic() + 15
    while client.exec(name, ["kill", "-0", pid]).exit_code == 0:
        assert time.monotonic() < deadline, "the exec outlived its client"
        time.sleep(0.2)
