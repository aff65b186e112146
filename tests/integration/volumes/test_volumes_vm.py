"""Volumes in ``vm`` guests (QEMU under TCG, virtiofs; docs/volumes.md): a
volume written by a container sandbox is read by a guest and back, what the
guest's root writes is sandbox root's, its quota holds, and a read-only
mount stays read-only even when the guest's root remounts it."""

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
        tmp_path_factory.mktemp("volvm"),
        env={
            "PODBAY_RUNTIME_CLASSES": "container,vm",
            "PODBAY_RUNTIME_MEMORY_BYTES": str(512 << 20),
            "PODBAY_RUNTIME_WARM_POOL": "0",
        },
    ) as s:
        s.wait_classes("vm")
        yield s


@pytest.fixture(scope="module")
def token(server: PlatformServer) -> str:
    return server.create_deployment("volvm")


def sh(server: PlatformServer, handle: dict[str, Any], script: str) -> dict[str, Any]:
    r = server.exec(handle, "sh", "-c", script, timeout_ms=120_000)
    assert r.status_code == 200, r.text
    out: dict[str, Any] = r.json()
    return out


def attach(server: PlatformServer, token: str, name: str, **body: Any) -> dict[str, Any]:
    r = server.attach(token, name, json=body, timeout=600)
    assert r.status_code == 200, r.text
    handle: dict[str, Any] = r.json()
    return handle


def test_a_vm_guest_shares_a_volume_with_a_container(server, token):
    r = server.api("POST", VOLUMES, token, json={"name": "both", "size_mib": 16})
    assert r.status_code == 201, r.text
    box = attach(server, token, "box", **{"class": "container", "volumes": {"/data": "both"}})
    assert sh(server, box, "echo from container > /data/c")["exit_code"] == 0
    guest = attach(
        server,
        token,
        "guest",
        **{
            "class": "vm",
            "volumes": {
                "/data": "both",
            },
        },
    )
    out = sh(server, guest, "cat /data/c && echo from vm > /data/v && stat -c %u /data/v")
    assert out["stdout"] == "from container\n0\n", out
    # The guest's root wrote it: sandbox root's in the container too, and writable there.
    out = sh(server, box, "cat /data/v && stat -c %u /data/v && echo more >> /data/v && echo ok")
    assert out["stdout"] == "from vm\n0\nok\n", out
    # Coherent both ways while both run (cache=none: every read asks the host).
    assert sh(server, guest, "cat /data/v")["stdout"] == "from vm\nmore\n"
    # The quota holds in the guest: ENOSPC, and the guest's own disk still takes writes.
    out = sh(server, guest, "dd if=/dev/zero of=/data/big bs=1M count=64 2>&1; echo rc=$?")
    assert "No space left on device" in out["stdout"], out
    assert "rc=0" not in out["stdout"], out
    assert sh(server, guest, "rm /data/big && echo ok > /tmp/ok && cat /tmp/ok")["stdout"] == "ok\n"
    for name in ("box", "guest"):
        assert server.api("DELETE", f"/api/v1/sandboxes/{name}", token).status_code == 204
    r = server.api("GET", f"{VOLUMES}/both/files", token, params={"path": "v"})
    assert r.content == b"from vm\nmore\n"


def test_a_read_only_volume_stays_read_only_in_a_guest(server, token):
    r = server.api("POST", VOLUMES, token, json={"name": "ro", "size_mib": 16})
    assert r.status_code == 201, r.text
    assert (
        server.api(
            "PUT", f"{VOLUMES}/ro/files", token, params={"path": "f"}, content=b"kept\n"
        ).status_code
        == 204
    )
    guest = attach(
        server,
        token,
        "ro-guest",
        **{"class": "vm", "volumes": {"/ro": {"name": "ro", "read_only": True}}},
    )
    assert sh(server, guest, "cat /ro/f")["stdout"] == "kept\n"
    # The guest's kernel is the sandbox's: its root remounts rw, and still cannot write.
    out = sh(
        server,
        guest,
        "mount -o remount,rw /ro && grep ' /ro ' /proc/mounts; "
        "echo x > /ro/f; echo y > /ro/g; cat /ro/f",
    )
    # The remount itself succeeds (the guest's own kernel), and writes still fail:
    # the daemon serves a read-only bind the host made.
    assert "virtiofs rw," in out["stdout"], out
    assert out["stdout"].endswith("kept\n"), out
    assert out["stderr"].count("Read-only file system") == 2, out
    assert server.api("DELETE", "/api/v1/sandboxes/ro-guest", token).status_code == 204
    r = server.api("GET", f"{VOLUMES}/ro/entries", token)
    assert [e["name"] for e in r.json()["entries"]] == ["f"]
