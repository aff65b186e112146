"""The host's disk: deleted files give their space back; new sandboxes stop at a reserve.

The attacks: write a lot inside, delete it, repeat. The disk's quota held, but
the sparse file on the host never shrank: the host's disk filled with blocks
no sandbox used any more. The disk is now mounted with ``discard``, so a
deletion punches the blocks out of the host file. And the defaults allowed
20 x 10 GiB per deployment whatever the host had: new sandboxes are now
refused with ``507 HOST_DISK_FULL`` while the host's free disk is below the
operator's reserve (``runtime.disk_reserve_bytes``), with nothing left behind.
"""

from __future__ import annotations

import os
import time

import pytest

from podbay.testing.fixtures import DriverSession, Machines
from podbay.testing.platform import PlatformServer

pytestmark = [pytest.mark.root, pytest.mark.alone, pytest.mark.timeout(180)]
MIB = 1024 * 1024


def test_deleted_files_return_space_to_the_host(
    oci_machines: Machines, oci_session: DriverSession
) -> None:
    m = oci_machines.up(disk_bytes=512 * MIB)
    disk = oci_session.driver.layout.machine(m.id).disk_image

    def allocated() -> int:
        return os.stat(disk).st_blocks * 512

    assert m.sh("head -c 134217728 /dev/urandom > /workspace/big && sync").ok
    full = allocated()
    assert full >= 128 * MIB
    assert m.sh("rm /workspace/big && sync").ok
    deadline = time.monotonic() + 20
    while allocated() > full - 96 * MIB:
        assert time.monotonic() < deadline, (
            f"the host file kept {allocated() // MIB} MiB after 128 MiB were deleted "
            f"(was {full // MIB} MiB)"
        )
        time.sleep(0.5)


def test_new_sandboxes_are_refused_below_the_disk_reserve(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    root = tmp_path_factory.mktemp("reserve")
    free = os.statvfs(root).f_bavail * os.statvfs(root).f_frsize
    # A reserve just above what is free: the host counts as full.
    with PlatformServer.start(
        root, env={"PODBAY_RUNTIME_DISK_RESERVE_BYTES": str(free + 1024**4)}
    ) as server:
        token = server.create_deployment("reserve-agent")
        refused = server.attach(token, "one-too-many")
        assert refused.status_code == 507, refused.text
        assert refused.json()["code"] == "HOST_DISK_FULL"
        assert "disk_reserve_bytes" in refused.json()["error"]
        listed = server.api("GET", "/api/v1/sandboxes", token).json()["sandboxes"]
        assert listed == []
        machines = server.data_dir / "machines"
        assert not machines.exists() or list(machines.iterdir()) == []
