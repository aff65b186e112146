"""A volume's files through the API, without a sandbox (docs/volumes.md,
"Files"): read, write, list, delete, and a sandbox's attempts to make the
API reach outside the volume (a symlink to /etc/shadow, ``..``, a FIFO, a
hard link to a host file) all refused."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from podbay.testing.platform import PlatformServer

pytestmark = pytest.mark.root

VOLUMES = "/api/v1/volumes"
FILES = f"{VOLUMES}/box/files"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PlatformServer]:
    with PlatformServer.start(
        tmp_path_factory.mktemp("volfiles"),
        env={"PODBAY_RUNTIME_CLASSES": "container", "PODBAY_RUNTIME_WARM_POOL": "0"},
    ) as s:
        yield s


@pytest.fixture(scope="module")
def token(server: PlatformServer) -> str:
    t = server.create_deployment("volfiles")
    r = server.api("POST", VOLUMES, t, json={"name": "box", "size_mib": 16})
    assert r.status_code == 201, r.text
    return t


@pytest.fixture(scope="module")
def sandbox(server: PlatformServer, token: str) -> dict[str, Any]:
    r = server.attach(token, "planter", json={"class": "container", "volumes": {"/v": "box"}})
    assert r.status_code == 200, r.text
    handle: dict[str, Any] = r.json()
    return handle


def sh(server: PlatformServer, handle: dict[str, Any], script: str) -> dict[str, Any]:
    r = server.exec(handle, "sh", "-c", script)
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


def refused(r: Any, status: int, code: str) -> None:
    assert r.status_code == status, r.text
    assert r.json()["code"] == code, r.text


def test_files_written_by_the_api_are_the_sandboxes_and_back(server, token, sandbox):
    r = server.api("PUT", FILES, token, params={"path": "/notes/a.txt"}, content=b"from api\n")
    assert r.status_code == 204, r.text
    out = sh(server, sandbox, "cat /v/notes/a.txt && stat -c %u /v/notes/a.txt /v/notes")
    assert out["stdout"].split("\n")[:3] == ["from api", "0", "0"], out
    assert sh(server, sandbox, "echo from sandbox > /v/notes/b.txt")["exit_code"] == 0
    r = server.api("GET", FILES, token, params={"path": "notes/b.txt"})
    assert r.status_code == 200, r.text
    assert r.content == b"from sandbox\n"
    entries = server.api("GET", f"{VOLUMES}/box/entries", token, params={"path": "notes"}).json()
    assert [(e["name"], e["type"]) for e in entries["entries"]] == [
        ("a.txt", "file"),
        ("b.txt", "file"),
    ]
    assert server.api("DELETE", FILES, token, params={"path": "notes"}).status_code == 204
    refused(
        server.api("GET", FILES, token, params={"path": "notes/a.txt"}),
        404,
        "VOLUME_PATH_NOT_FOUND",
    )
    assert sh(server, sandbox, "ls /v")["stdout"] == ""


def test_a_planted_symlink_to_etc_shadow_is_never_followed(server, token, sandbox):
    out = sh(
        server,
        sandbox,
        "ln -s /etc/shadow /v/shadow && ln -s / /v/root && mkdir -p /v/d && "
        "ln -s /etc /v/d/etc && echo ok",
    )
    assert out["stdout"] == "ok\n", out
    for path in ("shadow", "root/etc/shadow", "d/etc/shadow", "root", "d/etc/passwd"):
        r = server.api("GET", FILES, token, params={"path": path})
        refused(r, 400, "VOLUME_PATH_INVALID")
        assert b"root:" not in r.content
    # Writing through them is refused too, and the host's file is untouched.
    with open("/etc/shadow", "rb") as f:
        before = f.read()
    for path in ("shadow", "root/tmp/x", "d/etc/podbay-x"):
        refused(
            server.api("PUT", FILES, token, params={"path": path}, content=b"x"),
            400,
            "VOLUME_PATH_INVALID",
        )
    with open("/etc/shadow", "rb") as f:
        assert f.read() == before
    refused(
        server.api("GET", f"{VOLUMES}/box/entries", token, params={"path": "root"}),
        400,
        "VOLUME_PATH_INVALID",
    )
    # Deleting a symlink removes the link itself, never its target.
    assert server.api("DELETE", FILES, token, params={"path": "shadow"}).status_code == 204
    assert server.api("DELETE", FILES, token, params={"path": "root"}).status_code == 204
    assert server.api("DELETE", FILES, token, params={"path": "d"}).status_code == 204
    with open("/etc/shadow", "rb") as f:
        assert f.read() == before
    assert sh(server, sandbox, "ls -A /v")["stdout"] == ""


@pytest.mark.parametrize("path", ["../x", "a/../../x", "/../etc/shadow", "a//b", "./a", "a\x00b"])
def test_dot_dot_and_odd_paths_are_refused(server, token, path):
    refused(server.api("GET", FILES, token, params={"path": path}), 400, "VOLUME_PATH_INVALID")
    refused(
        server.api("PUT", FILES, token, params={"path": path}, content=b"x"),
        400,
        "VOLUME_PATH_INVALID",
    )


def test_a_fifo_or_a_hard_link_reaches_nothing_outside(server, token, sandbox):
    out = sh(server, sandbox, "mkfifo /v/fifo && echo made")
    assert out["stdout"] == "made\n", out
    refused(server.api("GET", FILES, token, params={"path": "fifo"}), 400, "VOLUME_PATH_INVALID")
    refused(
        server.api("PUT", FILES, token, params={"path": "fifo"}, content=b"x"),
        400,
        "VOLUME_PATH_INVALID",
    )
    # A volume is a filesystem of its own: no hard link crosses into it.
    out = sh(server, sandbox, "ln /etc/passwd /v/passwd 2>&1; echo rc=$?")
    assert "rc=0" not in out["stdout"], out
    assert server.api("DELETE", FILES, token, params={"path": "fifo"}).status_code == 204


def test_writes_past_the_quota_are_refused_by_the_api(server, token):
    big = b"\0" * (20 << 20)
    refused(
        server.api("PUT", FILES, token, params={"path": "big"}, content=big), 507, "VOLUME_FULL"
    )
    assert server.api("DELETE", FILES, token, params={"path": "big"}).status_code == 204


def test_bad_calls_have_codes(server, token):
    refused(server.api("GET", FILES, token), 400, "VOLUME_PATH_INVALID")
    refused(server.api("GET", FILES, token, params={"path": ""}), 400, "VOLUME_PATH_INVALID")
    refused(server.api("DELETE", FILES, token, params={"path": "/"}), 400, "VOLUME_PATH_INVALID")
    refused(
        server.api("GET", f"{VOLUMES}/nope/files", token, params={"path": "a"}),
        404,
        "VOLUME_NOT_FOUND",
    )
    other = server.create_deployment("volfiles-other")
    refused(server.api("GET", FILES, other, params={"path": "a"}), 404, "VOLUME_NOT_FOUND")


def test_deleting_a_deployment_removes_its_volumes(server):
    doomed = server.create_deployment("volfiles-doomed")
    r = server.api("POST", VOLUMES, doomed, json={"name": "gone", "size_mib": 16})
    assert r.status_code == 201, r.text
    deployment_id = next(
        p.name for p in (server.data_dir / "volumes").iterdir() if (p / "gone").exists()
    )
    admin = server.cli("admin", "token").stdout.strip().splitlines()[-1]
    r = server.http.delete(
        "/api/v1/deployments/volfiles-doomed", headers={"Authorization": f"Bearer {admin}"}
    )
    assert r.status_code == 204, r.text
    assert not (server.data_dir / "volumes" / deployment_id).exists()
