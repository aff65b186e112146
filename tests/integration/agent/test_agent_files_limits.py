"""Writes that the filesystem refuses: full (NO_SPACE) and read-only
(PATH_ACCESS_DENIED). Needs root to mount a small tmpfs."""

from __future__ import annotations

import hashlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from agent_harness import Agent


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
        pytest.skip("cannot mount a tmpfs here (needs root)")
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
