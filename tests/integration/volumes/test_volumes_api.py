"""Volumes end to end (docs/volumes.md): one real ``podbay serve`` running
``gvisor`` and ``container`` sandboxes, a volume written in one class and read
in the other, kept past both, its quota, read-only mounts and bad input."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from podbay.testing.platform import PlatformServer

pytestmark = pytest.mark.root

VOLUMES = "/api/v1/volumes"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PlatformServer]:
    with PlatformServer.start(
        tmp_path_factory.mktemp("volumes"),
        env={"PODBAY_RUNTIME_CLASSES": "gvisor,container", "PODBAY_RUNTIME_WARM_POOL": "0"},
    ) as s:
        yield s


@pytest.fixture(scope="module")
def token(server: PlatformServer) -> str:
    return server.create_deployment("volumes")


def sh(server: PlatformServer, handle: dict[str, Any], script: str) -> dict[str, Any]:
    r = server.exec(handle, "sh", "-c", script)
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


def attach(server: PlatformServer, token: str, name: str, **body: Any) -> dict[str, Any]:
    r = server.attach(token, name, json=body)
    assert r.status_code == 200, r.text
    handle: dict[str, Any] = r.json()
    return handle


def refused(r: Any, status: int, code: str) -> None:
    assert r.status_code == status, r.text
    assert r.json()["code"] == code, r.text


def test_a_volume_outlives_sandboxes_of_both_classes(server, token):
    r = server.api("POST", VOLUMES, token, json={"name": "shared", "size_mib": 32})
    assert r.status_code == 201, r.text
    assert r.json()["size_bytes"] == 32 << 20
    writer = attach(
        server, token, "writer", **{"class": "container", "volumes": {"/data": "shared"}}
    )
    assert writer["volumes"] == {"/data": {"name": "shared", "read_only": False}}
    out = sh(server, writer, "echo hello > /data/f && stat -c %u:%g /data/f && stat -c %u /data")
    assert out["exit_code"] == 0, out
    # Sandbox root (or the default user) owns what it writes, as seen inside.
    owner, root_owner = out["stdout"].split()
    assert root_owner == "0"
    assert owner.split(":")[0] in ("0", "1000"), out
    reader = attach(
        server,
        token,
        "reader",
        **{"class": "gvisor", "volumes": {"/in": {"name": "shared", "read_only": True}}},
    )
    assert sh(server, reader, "cat /in/f")["stdout"] == "hello\n"
    # Read-only: refused inside, in gVisor's kernel.
    out = sh(server, reader, "echo x > /in/g")
    assert out["exit_code"] != 0, out
    assert "Read-only" in out["stderr"], out
    # Both running: a later write of one class is seen by the other (gVisor
    # revalidates volume binds with its gofer; no exclusive hint on them).
    assert sh(server, writer, "echo second > /data/f2")["exit_code"] == 0
    assert sh(server, reader, "cat /in/f2")["stdout"] == "second\n"
    record = server.api("GET", f"{VOLUMES}/shared", token).json()
    assert record["mounted_by"] == ["reader", "writer"]
    refused(server.api("DELETE", f"{VOLUMES}/shared", token), 409, "VOLUME_IN_USE")
    for name in ("writer", "reader"):
        assert server.api("DELETE", f"/api/v1/sandboxes/{name}", token).status_code == 204
    listed = server.api("GET", VOLUMES, token).json()["volumes"]
    assert [v["name"] for v in listed] == ["shared"]
    assert listed[0]["mounted_by"] == []
    again = attach(server, token, "again", **{"class": "gvisor", "volumes": {"/data": "shared"}})
    assert sh(server, again, "cat /data/f /data/f2")["stdout"] == "hello\nsecond\n"
    assert server.api("DELETE", "/api/v1/sandboxes/again", token).status_code == 204
    assert server.api("DELETE", f"{VOLUMES}/shared", token).status_code == 204
    refused(server.api("GET", f"{VOLUMES}/shared", token), 404, "VOLUME_NOT_FOUND")


@pytest.mark.parametrize("class_", ["container", "gvisor"])
def test_writes_past_the_quota_fail_with_enospc(server, token, class_):
    name = f"quota-{class_}"
    r = server.api("POST", VOLUMES, token, json={"name": name, "size_mib": 16})
    assert r.status_code == 201, r.text
    box = attach(server, token, f"fill-{class_}", **{"class": class_, "volumes": {"/q": name}})
    out = sh(server, box, "dd if=/dev/zero of=/q/big bs=1M count=64 2>&1; echo rc=$?")
    assert "No space left on device" in out["stdout"], out
    assert "rc=0" not in out["stdout"], out
    used = server.api("GET", f"{VOLUMES}/{name}", token).json()["used_bytes"]
    assert used <= 16 << 20
    # The rest of the sandbox is untouched: its own disk still takes writes.
    assert sh(server, box, "echo ok > /tmp/ok && cat /tmp/ok")["stdout"] == "ok\n"
    assert server.api("DELETE", f"/api/v1/sandboxes/fill-{class_}", token).status_code == 204
    assert server.api("DELETE", f"{VOLUMES}/{name}", token).status_code == 204


@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({"name": "Bad", "size_mib": 32}, "VOLUME_NAME_INVALID"),
        ({"name": "..", "size_mib": 32}, "VOLUME_NAME_INVALID"),
        ({"name": "a/b", "size_mib": 32}, "VOLUME_NAME_INVALID"),
        ({"name": "ok", "size_mib": 0}, "VOLUME_SIZE_INVALID"),
        ({"name": "ok", "size_mib": 1}, "VOLUME_SIZE_INVALID"),
        ({"name": "ok", "size_bytes": (16 << 20) + 1}, "VOLUME_SIZE_INVALID"),
        ({"name": "ok", "size_bytes": 1 << 50}, "VOLUME_SIZE_INVALID"),
        ({"name": "ok"}, "VOLUME_SIZE_INVALID"),
        ({"name": "ok", "size_mib": 32, "size_bytes": 1 << 25}, "VOLUME_SIZE_INVALID"),
        ({"name": "ok", "size_mib": "32"}, "REQUEST_INVALID"),
        ({"name": "ok", "size_mib": 32, "extra": 1}, "REQUEST_INVALID"),
    ],
)
def test_bad_volumes_are_refused_with_a_code(server, token, body, code):
    r = server.api("POST", VOLUMES, token, json=body)
    assert r.status_code == 400, r.text
    assert r.json()["code"] == code


def test_a_volume_name_is_taken_once(server, token):
    r = server.api("POST", VOLUMES, token, json={"name": "once", "size_mib": 16})
    assert r.status_code == 201, r.text
    r = server.api("POST", VOLUMES, token, json={"name": "once", "size_mib": 16})
    refused(r, 409, "VOLUME_EXISTS")
    # Another deployment sees none of it.
    other = server.create_deployment("volumes-other")
    assert server.api("GET", VOLUMES, other).json()["volumes"] == []
    refused(server.api("GET", f"{VOLUMES}/once", other), 404, "VOLUME_NOT_FOUND")
    refused(server.api("DELETE", f"{VOLUMES}/once", other), 404, "VOLUME_NOT_FOUND")
    assert server.api("DELETE", f"{VOLUMES}/once", token).status_code == 204
    refused(server.api("GET", VOLUMES, None), 401, "IDENTITY_TOKEN_INVALID")


@pytest.mark.parametrize(
    ("volumes", "status", "code"),
    [
        ({"data": "v"}, 400, "VOLUME_MOUNT_INVALID"),
        ({"/": "v"}, 400, "VOLUME_MOUNT_INVALID"),
        ({"/proc/x": "v"}, 400, "VOLUME_MOUNT_INVALID"),
        ({"/etc": "v"}, 400, "VOLUME_MOUNT_INVALID"),
        ({"/.podbay/agent": "v"}, 400, "VOLUME_MOUNT_INVALID"),
        ({"/a/../etc": "v"}, 400, "VOLUME_MOUNT_INVALID"),
        ({"/a/": "v"}, 400, "VOLUME_MOUNT_INVALID"),
        ({"/a,b": "v"}, 400, "VOLUME_MOUNT_INVALID"),
        ({"/a": "v", "/b": "v"}, 400, "VOLUME_MOUNT_INVALID"),
        ({"/a": "../v"}, 400, "VOLUME_NAME_INVALID"),
        ({"/a": {"name": "v", "read_only": "yes"}}, 400, "REQUEST_INVALID"),
        ({"/a": "missing"}, 404, "VOLUME_NOT_FOUND"),
    ],
)
def test_bad_mounts_are_refused_at_attach(server, token, volumes, status, code):
    r = server.attach(token, "badmount", json={"class": "container", "volumes": volumes})
    refused(r, status, code)
    refused(server.api("GET", "/api/v1/sandboxes/badmount", token), 404, "SANDBOX_NOT_FOUND")
