"""``/v1/files…`` against a real agent."""

from __future__ import annotations

import hashlib
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from agent_harness import Agent

MIB = 1024 * 1024


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _put(
    agent: Agent, path: str, data: bytes, digest: str | None = None, mode: str | None = None
) -> httpx.Response:
    headers = {"X-Podbay-Sha256": digest if digest is not None else _sha(data)}
    if mode is not None:
        headers["X-Podbay-Mode"] = mode
    return agent.client.put("/v1/files", params={"path": path}, content=data, headers=headers)


def _code(resp: httpx.Response) -> tuple[int, str]:
    return resp.status_code, resp.json()["code"]


def test_binary_round_trip(agent: Agent, workspace: Path) -> None:
    data = bytes(range(256)) * 4096 + b"\x00\xff\x00"
    path = f"{workspace}/bin/blob.dat"
    resp = _put(agent, path, data)
    assert resp.status_code == 200, resp.text
    info = resp.json()
    assert (info["type"], info["size"], info["path"], info["name"]) == (
        "file",
        len(data),
        path,
        "blob.dat",
    )
    got = agent.client.get("/v1/files", params={"path": path})
    assert got.status_code == 200
    assert got.content == data
    assert got.headers["X-Podbay-Sha256"] == _sha(data)
    assert got.headers["Content-Length"] == str(len(data))
    assert (workspace / "bin" / "blob.dat").read_bytes() == data


def test_a_reader_asking_for_a_trailing_digest_gets_it_after_the_bytes(
    agent: Agent, workspace: Path
) -> None:
    # One pass over a large file in the agent: the digest follows the content.
    data = os.urandom(3 * MIB)
    (workspace / "big.bin").write_bytes(data)
    got = agent.client.get(
        "/v1/files",
        params={"path": str(workspace / "big.bin")},
        headers={"X-Podbay-Sha256": "trailing"},
    )
    assert got.status_code == 200
    assert got.headers["X-Podbay-Sha256"] == "trailing"
    assert got.headers["Content-Length"] == str(len(data) + 64)
    assert got.content == data + _sha(data).encode()
    # A small file keeps its digest first, whoever asks.
    (workspace / "small").write_bytes(b"tiny")
    small = agent.client.get(
        "/v1/files",
        params={"path": str(workspace / "small")},
        headers={"X-Podbay-Sha256": "trailing"},
    )
    assert (small.content, small.headers["X-Podbay-Sha256"]) == (b"tiny", _sha(b"tiny"))


def test_relative_paths_resolve_against_the_workspace(agent: Agent, workspace: Path) -> None:
    assert _put(agent, f"{workspace.name}/rel.txt", b"hi").status_code == 200
    assert (workspace / "rel.txt").read_bytes() == b"hi"


def test_chunked_upload_and_empty_file(agent: Agent, workspace: Path) -> None:
    parts = [b"a" * 70_000, b"\x00" * 3, b"z" * 100_000]
    data = b"".join(parts)

    def chunks() -> Iterator[bytes]:
        yield from parts

    resp = agent.client.put(
        "/v1/files",
        params={"path": f"{workspace}/c"},
        content=chunks(),
        headers={"X-Podbay-Sha256": _sha(data)},
    )
    assert resp.status_code == 200, resp.text
    assert (workspace / "c").read_bytes() == data
    assert _put(agent, f"{workspace}/empty", b"").json()["size"] == 0
    assert agent.client.get("/v1/files", params={"path": f"{workspace}/empty"}).content == b""


def test_digest_mismatch_leaves_previous_content(agent: Agent, workspace: Path) -> None:
    target = workspace / "keep.txt"
    target.write_bytes(b"old")
    resp = _put(agent, str(target), b"new", digest=_sha(b"other"))
    assert _code(resp) == (422, "DIGEST_MISMATCH")
    assert target.read_bytes() == b"old"
    resp = _put(agent, f"{workspace}/never.txt", b"new", digest=_sha(b"other"))
    assert _code(resp) == (422, "DIGEST_MISMATCH")
    assert sorted(p.name for p in workspace.iterdir()) == ["keep.txt"]  # no temp left


def test_digest_is_required_and_checked_for_form(agent: Agent, workspace: Path) -> None:
    resp = agent.client.put("/v1/files", params={"path": f"{workspace}/x"}, content=b"x")
    assert _code(resp) == (400, "DIGEST_MISSING")
    assert _code(_put(agent, f"{workspace}/x", b"x", digest="abc")) == (400, "REQUEST_INVALID")
    assert not (workspace / "x").exists()


def test_trailing_digest_follows_the_content(agent: Agent, workspace: Path) -> None:
    # X-Podbay-Sha256: trailing: the body's last 64 bytes are the hex digest of the rest.
    data = bytes(range(256)) * 5000 + b"tail"
    resp = _put(agent, f"{workspace}/t.bin", data + _sha(data).encode(), digest="trailing")
    assert resp.status_code == 200, resp.text
    assert resp.json()["size"] == len(data)
    assert (workspace / "t.bin").read_bytes() == data
    # in pieces smaller than the digest, so that it straddles reads
    parts = [
        data[:10],
        data[10:11],
        data[11:] + _sha(data).encode()[:30],
        _sha(data).encode()[30:63],
        _sha(data).encode()[63:],
    ]
    resp = agent.client.put(
        "/v1/files",
        params={"path": f"{workspace}/t2.bin"},
        content=iter(parts),
        headers={"X-Podbay-Sha256": "TRAILING"},
    )
    assert resp.status_code == 200, resp.text
    assert (workspace / "t2.bin").read_bytes() == data
    assert _put(agent, f"{workspace}/e", _sha(b"").encode(), digest="trailing").json()["size"] == 0


def test_trailing_digest_refusals_write_nothing(agent: Agent, workspace: Path) -> None:
    target = workspace / "keep.txt"
    target.write_bytes(b"old")
    wrong = _put(agent, str(target), b"new" + _sha(b"other").encode(), digest="trailing")
    assert _code(wrong) == (422, "DIGEST_MISMATCH")
    for body in (b"", b"short", b"x" * 10 + b"g" * 64, b"new" + b"trailing".ljust(64)):
        resp = _put(agent, str(target), body, digest="trailing")
        assert _code(resp) == (400, "REQUEST_INVALID"), body
    assert target.read_bytes() == b"old"
    assert sorted(p.name for p in workspace.iterdir()) == ["keep.txt"]  # no temp left


def test_mode_header_and_kept_mode(agent: Agent, workspace: Path) -> None:
    assert _put(agent, f"{workspace}/run.sh", b"#!/bin/sh\n", mode="0755").json()["mode"] == 0o755
    # A rewrite without a mode keeps the file's mode.
    assert _put(agent, f"{workspace}/run.sh", b"#!/bin/sh\necho\n").json()["mode"] == 0o755
    assert _code(_put(agent, f"{workspace}/m", b"", mode="rwx")) == (400, "REQUEST_INVALID")


@pytest.mark.parametrize(
    ("raw", "expected"),
    [("", (400, "PATH_INVALID")), ("a\u0000b", (400, "PATH_INVALID"))],
)
def test_invalid_paths(agent: Agent, raw: str, expected: tuple[int, str]) -> None:
    assert _code(agent.client.get("/v1/files", params={"path": raw})) == expected
    assert _code(agent.client.get("/v1/files/stat", params={"path": raw})) == expected
    assert _code(_put(agent, raw, b"x")) == expected
    assert _code(agent.client.get("/v1/files")) == (400, "PATH_INVALID")  # no path at all


def test_dot_dot_is_resolved_by_the_kernel(agent: Agent, workspace: Path) -> None:
    (workspace / "sub").mkdir()
    resp = _put(agent, f"{workspace}/sub/../up.txt", b"up")
    assert resp.json()["path"] == f"{workspace}/up.txt"
    assert (workspace / "up.txt").read_bytes() == b"up"
    stat = agent.client.get("/v1/files/stat", params={"path": f"{workspace}/sub/../up.txt"})
    assert stat.json()["path"] == f"{workspace}/up.txt"
    missing = agent.client.get("/v1/files", params={"path": f"{workspace}/nope/../up.txt"})
    assert _code(missing) == (404, "PATH_NOT_FOUND")


def test_symlink_to_a_directory_is_not_a_file(agent: Agent, workspace: Path) -> None:
    (workspace / "dir").mkdir()
    (workspace / "dir" / "inner").write_text("i")
    (workspace / "link").symlink_to(workspace / "dir")
    assert _code(agent.client.get("/v1/files", params={"path": f"{workspace}/link"})) == (
        400,
        "PATH_IS_DIRECTORY",
    )
    assert _code(_put(agent, f"{workspace}/link", b"x")) == (400, "PATH_IS_DIRECTORY")
    assert (workspace / "link").is_symlink()
    assert (workspace / "dir" / "inner").exists()
    stat = agent.client.get("/v1/files/stat", params={"path": f"{workspace}/link"}).json()
    assert stat["type"] == "symlink"
    listing = agent.client.get("/v1/files/list", params={"path": f"{workspace}/link"}).json()
    assert [e["name"] for e in listing["entries"]] == ["inner"]


def test_writing_through_a_file_symlink_keeps_the_link(agent: Agent, workspace: Path) -> None:
    (workspace / "real").write_text("old")
    (workspace / "alias").symlink_to("real")
    assert _put(agent, f"{workspace}/alias", b"new").status_code == 200
    assert (workspace / "alias").is_symlink()
    assert (workspace / "real").read_text() == "new"


def test_directory_and_file_confusions(agent: Agent, workspace: Path) -> None:
    (workspace / "f").write_text("f")
    (workspace / "d").mkdir()
    get = agent.client.get
    assert _code(get("/v1/files", params={"path": f"{workspace}/d"})) == (400, "PATH_IS_DIRECTORY")
    assert _code(_put(agent, f"{workspace}/d", b"x")) == (400, "PATH_IS_DIRECTORY")
    assert _code(get("/v1/files/list", params={"path": f"{workspace}/f"})) == (
        400,
        "PATH_NOT_DIRECTORY",
    )
    assert _code(_put(agent, f"{workspace}/f/child", b"x")) == (400, "PATH_NOT_DIRECTORY")
    assert _code(get("/v1/files", params={"path": f"{workspace}/none"})) == (404, "PATH_NOT_FOUND")
    assert _code(get("/v1/files/list", params={"path": f"{workspace}/none"})) == (
        404,
        "PATH_NOT_FOUND",
    )
    assert _code(_put(agent, f"{workspace}/trailing/", b"x")) == (400, "PATH_INVALID")


def test_fifo_is_refused_not_waited_on(agent: Agent, workspace: Path) -> None:
    os.mkfifo(workspace / "fifo")
    assert _code(agent.client.get("/v1/files", params={"path": f"{workspace}/fifo"})) == (
        400,
        "PATH_INVALID",
    )


def test_special_files_are_refused_as_invalid(agent: Agent, workspace: Path) -> None:
    """Files that open as no file does (a unix socket, a terminal with nothing
    behind it, the agent's own memory) are 400 PATH_INVALID, not 500."""
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(workspace / "sock"))
    try:
        for path in (f"{workspace}/sock", "/dev/tty", "/proc/self/mem"):
            answer = agent.client.get("/v1/files", params={"path": path})
            assert _code(answer) == (400, "PATH_INVALID"), (path, answer.text)
    finally:
        listener.close()


def test_list_and_stat(agent: Agent, workspace: Path) -> None:
    (workspace / "b.txt").write_bytes(b"12345")
    (workspace / "a").mkdir()
    (workspace / "c").symlink_to("b.txt")
    os.chmod(workspace / "b.txt", 0o640)
    listing = agent.client.get("/v1/files/list", params={"path": str(workspace)}).json()
    assert listing["path"] == str(workspace)
    rows = [(e["name"], e["type"]) for e in listing["entries"]]
    assert rows == [("a", "directory"), ("b.txt", "file"), ("c", "symlink")]
    b: dict[str, Any] = listing["entries"][1]
    assert (b["size"], b["mode"], b["path"]) == (5, 0o640, f"{workspace}/b.txt")
    assert b["mtime"].endswith("Z")
    stat = agent.client.get("/v1/files/stat", params={"path": f"{workspace}/b.txt"}).json()
    assert stat == b


def test_delete(agent: Agent, workspace: Path) -> None:
    (workspace / "f").write_text("f")
    (workspace / "tree" / "deep").mkdir(parents=True)
    (workspace / "tree" / "deep" / "x").write_text("x")
    delete = agent.client.delete
    assert delete("/v1/files", params={"path": f"{workspace}/f"}).status_code == 204
    assert not (workspace / "f").exists()
    assert _code(delete("/v1/files", params={"path": f"{workspace}/f"})) == (404, "PATH_NOT_FOUND")
    assert _code(delete("/v1/files", params={"path": f"{workspace}/tree"})) == (
        409,
        "DIRECTORY_NOT_EMPTY",
    )
    resp = delete("/v1/files", params={"path": f"{workspace}/tree", "recursive": "true"})
    assert resp.status_code == 204
    assert not (workspace / "tree").exists()


def test_mkdir(agent: Agent, workspace: Path) -> None:
    resp = agent.client.post("/v1/files/mkdir", json={"path": f"{workspace}/a/b/c", "mode": 0o700})
    assert resp.status_code == 200
    assert (resp.json()["type"], resp.json()["mode"]) == ("directory", 0o700)
    again = agent.client.post("/v1/files/mkdir", json={"path": f"{workspace}/a/b/c"})
    assert again.status_code == 200  # parents=True: like mkdir -p
    exists = agent.client.post(
        "/v1/files/mkdir", json={"path": f"{workspace}/a/b/c", "parents": False}
    )
    assert _code(exists) == (409, "PATH_EXISTS")
    orphan = agent.client.post(
        "/v1/files/mkdir", json={"path": f"{workspace}/x/y", "parents": False}
    )
    assert _code(orphan) == (404, "PATH_NOT_FOUND")


def test_large_file_streams_in_constant_memory(fresh_agent: Agent) -> None:
    size = 96 * MIB
    block = os.urandom(MIB)
    data_digest = hashlib.sha256()
    for _ in range(size // MIB):
        data_digest.update(block)

    def body() -> Iterator[bytes]:
        for _ in range(size // MIB):
            yield block

    before = fresh_agent.rss_kib("VmRSS")
    resp = fresh_agent.client.put(
        "/v1/files",
        params={"path": "big"},
        content=body(),
        headers={"X-Podbay-Sha256": data_digest.hexdigest()},
    )
    assert resp.status_code == 200
    assert resp.json()["size"] == size
    received = hashlib.sha256()
    total = 0
    with fresh_agent.client.stream("GET", "/v1/files", params={"path": "big"}) as got:
        assert got.headers["X-Podbay-Sha256"] == data_digest.hexdigest()
        for chunk in got.iter_raw():
            received.update(chunk)
            total += len(chunk)
    assert total == size
    assert received.hexdigest() == data_digest.hexdigest()
    peak = fresh_agent.rss_kib("VmHWM")
    assert peak - before < 16 * 1024, (before, peak)


def test_upload_cut_short_leaves_nothing_behind(agent: Agent, workspace: Path) -> None:
    import socket

    (workspace / "keep").write_bytes(b"old")
    head = (
        f"PUT /v1/files?path={workspace}/keep HTTP/1.1\r\nHost: a\r\n"
        f"X-Podbay-Sha256: {'0' * 64}\r\nContent-Length: 100000\r\n\r\n"
    ).encode()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(agent.sock_path)
        sock.sendall(head + b"x" * 5000)
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline and len(list(workspace.iterdir())) > 1:
        time.sleep(0.02)
    assert sorted(p.name for p in workspace.iterdir()) == ["keep"]
    assert (workspace / "keep").read_bytes() == b"old"


def test_overwriting_a_large_file_frees_the_old_one_after_answering(
    agent: Agent, workspace: Path
) -> None:
    """The replaced file is held across the rename and let go by a thread of its
    own: the new content is in place at once, and no descriptor is left behind."""
    path = f"{workspace}/big.bin"
    first, second = os.urandom(9 * MIB), os.urandom(9 * MIB)
    assert _put(agent, path, first).status_code == 200
    fds = len(os.listdir(f"/proc/{agent.pid}/fd"))
    old_inode = (workspace / "big.bin").stat().st_ino
    assert _put(agent, path, second).status_code == 200
    assert (workspace / "big.bin").read_bytes() == second
    assert (workspace / "big.bin").stat().st_ino != old_inode
    deadline = time.monotonic() + 10
    while len(os.listdir(f"/proc/{agent.pid}/fd")) > fds:
        assert time.monotonic() < deadline, "the replaced file is still held"
        time.sleep(0.02)
    held = []
    for fd in os.listdir(f"/proc/{agent.pid}/fd"):
        try:
            held.append(os.readlink(f"/proc/{agent.pid}/fd/{fd}"))
        except FileNotFoundError:
            continue  # closed meanwhile
    assert not any("big.bin" in target for target in held)
