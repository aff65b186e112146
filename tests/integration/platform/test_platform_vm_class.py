"""The ``vm`` class through the HTTP API beside ``container``: QEMU guests under
TCG (never KVM here), with their own kernel, proven in the background while
the server already serves the default class. (Adopt after a kill -9 is the
vm conformance suite's.)"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

import pytest

from podbay.testing.platform import PlatformServer

pytestmark = pytest.mark.root


def wait_for_class(server: PlatformServer, name: str, timeout: float = 600) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        health: dict[str, Any] = server.http.get("/healthz").json()
        if name in health["classes"]["available"]:
            return health
        assert time.monotonic() < deadline, f"{name} never became available: {health}"
        time.sleep(0.5)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PlatformServer]:
    with PlatformServer.start(
        tmp_path_factory.mktemp("vm-class"),
        env={
            "PODBAY_RUNTIME_CLASSES": "vm,container",
            "PODBAY_RUNTIME_MEMORY_BYTES": str(512 << 20),
        },
    ) as s:
        yield s


def test_vm_sandboxes_run_their_own_kernel_beside_containers(server):
    health = wait_for_class(server, "vm")
    # Under TCG vm works when named, but is not what default means.
    assert health["classes"]["default"] == "container"
    token = server.create_deployment("vm-agent")
    r = server.attach(token, "guest", json={"class": "vm"})
    assert r.status_code == 200, r.text
    handle = r.json()
    assert handle["class"] == "vm"
    assert handle["start"] == "created"
    release = server.exec(handle, "uname", "-r").json()["stdout"].strip()
    assert release
    assert release != os.uname().release
    assert server.exec(handle, "sh", "-c", "echo kept > /workspace/f").json()["exit_code"] == 0
    assert server.attach(token, "plain").json()["runtime_class"] == "container"
    # Suspend (QMP stop) and resume keep memory and files.
    assert server.api("POST", "/api/v1/sandboxes/guest/stop", token).status_code == 204
    back = server.attach(token, "guest").json()
    assert back["start"] == "resumed"
    assert back["runtime_class"] == "vm"
    assert server.exec(back, "cat", "/workspace/f").json()["stdout"] == "kept\n"
    # The class's proof machine had the sandboxes' shape: one template (built or
    # building) serves both, no guest booted for a shape no sandbox has.
    built = (server.data_dir / "vm" / "templates").iterdir()
    assert len({p.name.lstrip(".").split(".")[0] for p in built}) == 1
    assert server.api("DELETE", "/api/v1/sandboxes/guest", token).status_code == 204
    assert not list((server.data_dir / "vm" / "machines").iterdir())


def _clock_skew(server: PlatformServer, handle: dict[str, Any]) -> tuple[float, float]:
    """How far the guest's wall clock is before and after the host's: the guest's
    ``date`` against the host's clock just before the call and just after it."""
    before = time.time()
    r = server.exec(handle, "date", "+%s.%N")
    after = time.time()
    assert r.status_code == 200, r.text
    guest = float(r.json()["stdout"])
    return before - guest, guest - after


def test_a_resumed_guest_takes_on_the_host_clock(server):
    wait_for_class(server, "vm")
    token = server.create_deployment("vm-clock")
    handle = server.attach(token, "clock", json={"class": "vm"}).json()
    # Booted or restored from a template saved earlier: the guest's clock is now.
    behind, ahead = _clock_skew(server, handle)
    assert behind < 1, (behind, ahead)
    assert ahead < 1, (behind, ahead)
    assert server.api("POST", "/api/v1/sandboxes/clock/stop", token).status_code == 204
    assert server.api("GET", "/api/v1/sandboxes/clock", token).json()["state"] == "suspended"
    suspended = time.time()
    # The suspension's length is what is tested: its guest's clock stands still.
    time.sleep(3)
    back = server.attach(token, "clock").json()
    assert back["start"] == "resumed"
    assert time.time() - suspended >= 3
    behind, ahead = _clock_skew(server, back)
    assert behind < 1, (behind, ahead)
    assert ahead < 1, (behind, ahead)
    assert server.api("DELETE", "/api/v1/sandboxes/clock", token).status_code == 204


def test_guest_mountinfo_names_no_host_path(server):
    """The guest mounts its own disks: nothing of the host's paths reaches it."""
    wait_for_class(server, "vm")
    token = server.create_deployment("vm-mounts")
    handle = server.attach(token, "mounts", json={"class": "vm"}).json()
    mountinfo = server.exec(handle, "cat", "/proc/self/mountinfo").json()["stdout"]
    assert " / / " in mountinfo  # its root, from its own disk
    for path in (str(server.data_dir), server.env["PODBAY_RUNTIME_IMAGE_DIR"], server.run_dir):
        assert path not in mountinfo, (path, mountinfo)
    assert server.api("DELETE", "/api/v1/sandboxes/mounts", token).status_code == 204
