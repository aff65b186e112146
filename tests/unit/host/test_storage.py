"""A machine's disk file: sparse, of exactly its quota, copied from one template per size.
(Mounting it needs root: tests/integration/runtime.)"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

from podbay.host import storage

MIB = 1 << 20


def test_a_disk_is_a_sparse_ext4_file_of_the_quota(tmp_path: Path) -> None:
    assert shutil.which("mkfs.ext4"), "e2fsprogs is installed by ./run"
    disk = tmp_path / "machines/m1/disk.ext4"
    disk.parent.mkdir(parents=True)
    asyncio.run(storage.make_disk(disk, 64 * MIB, tmp_path / "templates"))
    assert disk.stat().st_size == 64 * MIB
    assert disk.stat().st_blocks * 512 < 16 * MIB, "the copy is not sparse"
    with open(disk, "rb") as f:
        f.seek(1024 + 0x38)  # the ext superblock's magic
        assert f.read(2) == b"\x53\xef"
    assert sorted(p.name for p in disk.parent.iterdir()) == ["disk.ext4"]  # no temporary


def test_a_disk_copies_little_from_its_template(tmp_path: Path) -> None:
    """Every create copies the template's data: at 10 GiB, ext4's blocks reserved
    for a resize while mounted were 4 MB of it, and nothing resizes these disks."""
    disk = tmp_path / "disk.ext4"
    asyncio.run(storage.make_disk(disk, 10 * 1024 * MIB, tmp_path / "templates"))
    assert disk.stat().st_blocks * 512 < 1 * MIB


def test_one_template_per_size_is_made_once(tmp_path: Path) -> None:
    templates = tmp_path / "templates"
    asyncio.run(storage.make_disk(tmp_path / "a.ext4", 32 * MIB, templates))
    template = templates / f"ext4-{32 * MIB}.img"
    made = template.stat().st_mtime_ns
    asyncio.run(storage.make_disk(tmp_path / "b.ext4", 32 * MIB, templates))
    assert template.stat().st_mtime_ns == made
    assert (tmp_path / "a.ext4").read_bytes() == (tmp_path / "b.ext4").read_bytes()
    asyncio.run(storage.make_disk(tmp_path / "c.ext4", 48 * MIB, templates))
    assert sorted(p.name for p in templates.iterdir()) == [
        f"ext4-{32 * MIB}.img",
        f"ext4-{48 * MIB}.img",
    ]


def test_mount_points_are_this_namespaces(tmp_path: Path) -> None:
    points = storage.mountpoints()
    assert "/" in points
    assert "/proc" in points
    assert storage.is_mounted(Path("/proc"))
    assert not storage.is_mounted(tmp_path)
    # The cheap check agrees on a filesystem of its own, and on a plain directory.
    assert storage.holds_own_mount(Path("/proc"))
    assert not storage.holds_own_mount(tmp_path)
    assert not storage.holds_own_mount(tmp_path / "absent")


def test_disk_commitment_adds_up_every_machine_and_says_when_overcommitted(tmp_path: Path) -> None:
    from podbay.host import records
    from podbay.host.storage import DiskCommitment, disk_commitment
    from podbay.runtime.base import Limits, MachineSpec, MachineState

    gib = 1024**3
    for name, machines in (("a", tmp_path / "container"), ("b", tmp_path / "gvisor")):
        home = machines / name
        home.mkdir(parents=True)
        spec = MachineSpec(
            machine_id=name,
            hostname="h",
            limits=Limits(memory_bytes=1, cpus=1.0, pids=1, disk_bytes=10 * gib),
        )
        records.write(home, records.MachineRecord(spec, MachineState.STOPPED, ""))
        (home / "disk.ext4").write_bytes(b"x" * 8192)
    (tmp_path / "container" / "half-made").mkdir()  # no record: not counted
    found = disk_commitment([tmp_path / "container", tmp_path / "gvisor", tmp_path / "container"])
    assert (found.machines, found.promised) == (2, 20 * gib)
    assert found.allocated >= 2 * 8192
    assert "2 sandbox disks may grow to 20.0 GiB" in found.describe(5 * gib)
    tight = DiskCommitment(machines=20, promised=200 * gib, allocated=10 * gib, free=50 * gib)
    assert tight.ratio == 190 / 50
    assert "overcommitted 3.8x" in tight.describe(5 * gib)
    roomy = DiskCommitment(machines=1, promised=gib, allocated=0, free=50 * gib)
    assert roomy.describe(0).endswith("not overcommitted")
