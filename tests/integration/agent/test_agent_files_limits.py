"""Writes that the filesystem refuses: full (NO_SPACE) and read-only
(PATH_ACCESS_DENIED). Needs root to mount a small tmpfs."""

from __future__ import annotations

import hashlib
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from agent_harness import Agent

from podbay.testing.fixtures import host_cannot


def _mount(target: Path, options: str) -> bool:
    target.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(target)],
        capture_output=True,
        check=False,
    )
    return done.returncode == 0


@pytest.fixture
def small_fs(workspace: Path) -> Iterator[Path]:
    target = workspace / "small"
    if not _mount(target, "size=256k"):
        host_cannot("cannot mount a tmpfs here (needs root)")
    yield target
    subprocess.run(["umount", "-l", str(target)], check=False)


def test_full_filesystem_is_no_space_and_leaves_nothing(agent: Agent, small_fs: Path) -> None:
    (small_fs / "keep").write_bytes(b"old")
    data = b"x" * (1024 * 1024)
    resp = agent.client.put(
        "/v1/files",
        params={"path": f"{small_fs}/keep"},
        content=data,
        headers={"X-Podbay-Sha256": hashlib.sha256(data).hexdigest()},
    )
    assert (resp.status_code, resp.json()["code"]) == (507, "NO_SPACE")
    assert sorted(p.name for p in small_fs.iterdir()) == ["keep"]
    assert (small_fs / "keep").read_bytes() == b"old"


def test_a_write_larger_than_the_free_space_is_refused_before_its_body(
    agent: Agent, small_fs: Path
) -> None:
    """The space is taken when the head arrives: a body that cannot fit is not
    waited for (none of it is sent here), and nothing is left behind."""
    head = (
        f"PUT /v1/files?path={small_fs}/big HTTP/1.1\r\nHost: agent\r\n"
        f"X-Podbay-Sha256: {'0' * 64}\r\nContent-Length: {64 * 1024 * 1024}\r\n\r\n"
    )
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(20)  # a liveness bound: without the early refusal it waits for the body
        sock.connect(agent.sock_path)
        sock.sendall(head.encode())
        answer = sock.recv(65536)
        assert answer.startswith(b"HTTP/1.1 507 "), answer[:200]
        assert b'"NO_SPACE"' in answer
        # It goes on reading (and dropping) the body for a moment instead of
        # hanging up on a writer: a reset there could lose the answer.
        sock.sendall(b"z" * (1024 * 1024))
        sock.shutdown(socket.SHUT_WR)
        assert sock.recv(65536) == b""
    assert list(small_fs.iterdir()) == []


def test_read_only_filesystem_is_access_denied(agent: Agent, small_fs: Path) -> None:
    subprocess.run(["mount", "-o", "remount,ro", str(small_fs)], check=True)
    resp = agent.client.put(
        "/v1/files",
        params={"path": f"{small_fs}/new"},
        content=b"x",
        headers={"X-Podbay-Sha256": hashlib.sha256(b"x").hexdigest()},
    )
    assert (resp.status_code, resp.json()["code"]) == (409, "PATH_ACCESS_DENIED")
    resp = agent.client.post("/v1/files/mkdir", json={"path": f"{small_fs}/d"})
    assert (resp.status_code, resp.json()["code"]) == (409, "PATH_ACCESS_DENIED")
