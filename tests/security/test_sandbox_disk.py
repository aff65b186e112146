"""A sandbox's deleted files give their space back to the host.

The attack (or just a busy sandbox): write a lot, delete it, repeat. Its
disk's quota held, but the sparse file on the host never shrank: the host's
disk filled with blocks no sandbox used any more. The disk is now mounted
with ``discard``, so a deletion punches the blocks out of the host file.
"""

from __future__ import annotations

import os
import time

import pytest

from podbay.testing.fixtures import DriverSession, Machines

pytestmark = [pytest.mark.root, pytest.mark.timeout(180)]
MIB = 1024 * 1024


def test_deleted_files_return_space_to_the_host(oci_machines: Machines,
                                                oci_session: DriverSession) -> None:
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
            f"(was {full // MIB} MiB)")
        time.sleep(0.5)
