"""Every client method, sync and async, against a real platform (see conftest).

An attach answered 202 (an environment still building) is tested elsewhere: its
rules in tests/unit/client (both faces, 202s on demand), and for real through
the SDK in tests/integration/environment, where a real layer build makes them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from podbay.client import (
    DirEntry,
    GrepMatch,
    SandboxRequestError,
    SandboxUnavailableError,
)

pytestmark = pytest.mark.root

BINARY = b"\x00\xff" * 1000 + bytes(range(256)) + b"\xff\x00\n\r\x00"


def test_commands(client: Any, name: str) -> None:
    handle = client.attach(name)
    assert handle.state == "running"
    assert handle.name == name
    result = client.exec(
        name, ["/bin/sh", "-c", "echo out; echo err >&2; exit 3"], env={"GREETING": "hi"}
    )
    assert (result.exit_code, result.stdout, result.stderr) == (3, "out\n", "err\n")
    assert (
        client.exec(name, ["/bin/sh", "-c", 'echo "$GREETING"'], env={"GREETING": "hi"}).stdout
        == "hi\n"
    )
    timed = client.exec(name, ["sleep", "10"], timeout_ms=300)
    assert timed.timed_out
    assert timed.exit_code == 137
    combined = client.exec_combined(name, "echo 1; echo 2 >&2; echo 3")
    assert (combined.output, combined.exit_code) == ("1\n2\n3\n", 0)
    with pytest.raises(SandboxRequestError) as info:
        client.exec(name, ["/definitely/not/here"])
    assert (info.value.status, info.value.code) == (400, "COMMAND_START_FAILED")


def test_processes(client: Any, name: str) -> None:
    proc = client.spawn(name, ["/bin/sh", "-c", "echo ready; exec sleep 30"])
    assert proc.state == "running"
    assert proc.process_id in [p.process_id for p in client.processes(name)]
    deadline = time.monotonic() + 10
    chunk = client.poll(name, proc.process_id)
    while not chunk.stdout and time.monotonic() < deadline:
        time.sleep(0.05)
        chunk = client.poll(name, proc.process_id)
    assert chunk.stdout == "ready\n"
    assert chunk.stdout_next == 6
    client.signal(name, proc.process_id, "TERM")
    while chunk.state != "exited" and time.monotonic() < deadline:
        time.sleep(0.05)
        chunk = client.poll(name, proc.process_id, stdout_from=6)
    assert chunk.exit_code == 143
    assert chunk.stdout == ""
    client.kill(name, proc.process_id)
    assert proc.process_id not in [p.process_id for p in client.processes(name)]


def test_run(client: Any, name: str) -> None:
    chunks: list[str] = []
    result = client.run(
        name,
        ["/bin/sh", "-c", "for i in 1 2 3; do echo $i; sleep 0.1; done; echo bad >&2; exit 5"],
        interval_ms=50,
        on_output=lambda c: chunks.append(c.stdout),
    )
    assert (result.exit_code, result.stdout, result.stderr) == (5, "1\n2\n3\n", "bad\n")
    assert not result.killed
    assert "".join(chunks) == "1\n2\n3\n"
    timed = client.run(
        name, ["/bin/sh", "-c", "echo begin; exec sleep 30"], interval_ms=50, timeout_ms=500
    )
    assert timed.killed
    assert timed.timed_out
    assert timed.stdout == "begin\n"
    cancel = threading.Event()
    threading.Timer(0.3, cancel.set).start()
    cancelled = client.run(name, ["sleep", "30"], interval_ms=50, cancel=cancel)
    assert cancelled.killed
    assert not cancelled.timed_out
    assert client.processes(name) == []  # run reaps what it spawned


@pytest.mark.parametrize("files", ["auto", "base64"])
def test_files(make_client: Any, name: str, files: str, tmp_path: Path) -> None:
    client = make_client(files=files)
    client.write_file_bytes(name, "data.bin", BINARY)
    assert client.read_file_bytes(name, "data.bin") == BINARY
    client.write_file(name, "notes.txt", "héllo\nTODO: x:y\n")
    assert client.read_file(name, "notes.txt") == "héllo\nTODO: x:y\n"
    with pytest.raises(SandboxRequestError) as info:
        client.read_file(name, "missing.txt")
    assert info.value.status == 404
    client.exec(name, ["mkdir", "-p", "sub"])
    with pytest.raises(SandboxRequestError) as info:
        client.read_file_bytes(name, "sub")  # a directory cannot be read: 404, as the reference
    assert info.value.status == 404
    names = {(e.name, e.is_directory) for e in client.list_dir(name)}
    assert {("notes.txt", False), ("sub", True)} <= names
    assert client.grep(name, "TODO", "notes.txt") == [
        GrepMatch(path="notes.txt", line=2, text="TODO: x:y")
    ]
    assert client.grep(name, "TODO") == [GrepMatch(path="./notes.txt", line=2, text="TODO: x:y")]
    assert client.grep(name, "no-such-thing") == []
    with pytest.raises(SandboxRequestError) as info:
        client.list_dir(name, "nowhere")
    assert info.value.status == 404


def test_upload_download_tree(client: Any, name: str, tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    (tree / "deep" / "er").mkdir(parents=True)
    (tree / "a.bin").write_bytes(BINARY)
    (tree / "deep" / "er" / "b.txt").write_text("b\n")
    client.upload(name, tree, "project")
    assert client.read_file(name, "project/deep/er/b.txt") == "b\n"
    client.download(name, "project", tmp_path / "back")
    assert (tmp_path / "back" / "a.bin").read_bytes() == BINARY
    assert (tmp_path / "back" / "deep" / "er" / "b.txt").read_text() == "b\n"
    assert DirEntry(name="project", is_directory=True) in client.list_dir(name)


def _digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def test_50_mib_both_ways(client: Any, name: str, tmp_path: Path) -> None:
    source = tmp_path / "big.bin"
    with open(source, "wb") as f:
        for _ in range(50):
            f.write(os.urandom(1 << 20))
    client.upload(name, source, "big.bin")
    remote = client.exec(name, ["sha256sum", "big.bin"]).stdout.split()[0]
    assert remote == _digest(source)
    client.download(name, "big.bin", tmp_path / "back.bin")
    assert _digest(tmp_path / "back.bin") == _digest(source)


def test_control_plane(client: Any, name: str) -> None:
    handle = client.attach(name)
    record = client.get(name)
    # The caller's word ("default": none given) on podbay and the reference stub
    # alike; podbay adds the class that runs (runtime_class; the stub has none).
    assert handle.class_ == record.class_ == "default"
    assert record.name == name
    assert record.runtime_class == handle.runtime_class
    assert name in [r.name for r in client.list()]
    client.stop(name)
    assert client.exec(name, ["true"]).exit_code == 0  # the next call resumes it
    client.delete(name)
    with pytest.raises(SandboxRequestError) as info:
        client.get(name)
    assert (info.value.status, info.value.code) == (404, "SANDBOX_NOT_FOUND")


def test_handle_object(platform: Any, name: str) -> None:
    from podbay import SandboxClient

    with (
        SandboxClient(identity_token=platform.token, server_url=platform.url) as client,
        client.sandbox(name) as sb,
    ):
        sb.write_file("hi.py", "print('hi')\n")
        assert sb.exec(["python3", "hi.py"]).stdout == "hi\n"


class CountAttaches(httpx.BaseTransport):
    def __init__(self) -> None:
        self.inner = httpx.HTTPTransport()
        self.attaches = 0
        self.execs = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.attaches += request.method == "PUT" and "/api/v1/sandboxes/" in request.url.path
        self.execs += request.url.path.endswith("/v1/exec")
        return self.inner.handle_request(request)

    def close(self) -> None:
        # httpx closes the transport it was given, not the one inside it: without
        # this, the inner pool's connections are left to the collector.
        self.inner.close()


def test_401_reattaches_once(platform: Any, name: str) -> None:
    """A forged credential is refused by the real gateway; the client re-attaches once."""
    from podbay import SandboxClient

    transport = CountAttaches()
    with SandboxClient(
        identity_token=platform.token, server_url=platform.url, transport=transport
    ) as client:
        handle = client.attach(name)
        forged = {k: v[:-4] + "AAAA" for k, v in handle.headers.items()}
        client._core.store(name, dataclasses.replace(handle, headers=forged))
        assert client.exec(name, ["echo", "ok"]).stdout == "ok\n"
        assert (transport.attaches, transport.execs) == (2, 2)


class LoseAnswers(httpx.BaseTransport):
    """Sends the request for real, then drops the answer like a cut connection."""

    def __init__(self) -> None:
        self.inner = httpx.HTTPTransport()
        self.sent: list[str] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = self.inner.handle_request(request)
        if request.url.path.endswith("/v1/exec"):
            response.read()
            response.close()
            self.sent.append(request.url.path)
            raise httpx.ReadError("connection reset after the request was sent", request=request)
        return response

    def close(self) -> None:
        # As CountAttaches.close.
        self.inner.close()


class ALoseAnswers(httpx.AsyncBaseTransport):
    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.sent: list[str] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self.inner.handle_async_request(request)
        if request.url.path.endswith("/v1/exec"):
            await response.aread()
            await response.aclose()
            self.sent.append(request.url.path)
            raise httpx.ReadError("connection reset after the request was sent", request=request)
        return response

    async def aclose(self) -> None:
        await self.inner.aclose()


def test_transport_failure_is_not_retried(
    make_client: Any, face: str, name: str, platform: Any
) -> None:
    transport: Any = LoseAnswers() if face == "sync" else ALoseAnswers()
    client = make_client(transport=transport)
    client.attach(name)
    with pytest.raises(SandboxUnavailableError) as info:
        client.exec(name, ["/bin/sh", "-c", "echo once >> ran.txt"])
    assert isinstance(info.value.cause, httpx.ReadError)
    assert len(transport.sent) == 1
    plain = make_client()
    assert plain.read_file(name, "ran.txt") == "once\n"  # ran exactly once
