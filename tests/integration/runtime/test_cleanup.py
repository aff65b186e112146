"""After destroy nothing is left: mounts, cgroups, processes, namespaces, loop devices,
directories. And ``podbay gc`` removes what a crash left behind."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from podbay.host import storage
from podbay.runtime.base import DriverError, MachineState
from podbay.runtime.machines import INCOMING_PREFIX, STALE_INCOMING_SECONDS
from podbay.testing.fixtures import DriverSession, small_spec

pytestmark = pytest.mark.root
NAMESPACES = ("mnt", "pid", "net", "user", "uts", "ipc", "cgroup")


def footprint(session: DriverSession) -> dict[str, object]:
    driver = session.driver
    layout = driver.layout  # type: ignore[attr-defined]
    roots = (str(layout.run_dir), str(layout.data_dir))
    # The image's and the agent's read-only views serve every machine (gc --all
    # unmounts them): the node's, not a machine's footprint.
    views = str(layout.neutral)
    mounts = sorted(
        m for m in storage.mountpoints() if m.startswith(roots) and not m.startswith(views)
    )
    cgroups = sorted(
        str(p)
        for d in driver.cgroups.existing(layout.cgroup_parent)  # type: ignore[attr-defined]
        for p in d.rglob("*")
        if p.is_dir()
    )
    # Other test sessions on this host run sandboxes in the same uid range: pick ours
    # by cgroup (this data directory's instance) or by our run directory.
    procs = []
    marker = layout.instance.encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cgroup = (entry / "cgroup").read_bytes()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if marker in cgroup or str(layout.run_dir).encode() in cmdline:
            procs.append(entry.name)
    disks = {str(p) for p in layout.machines.glob("*/disk.ext4")}
    return {
        "mounts": mounts,
        "cgroups": cgroups,
        "processes": sorted(procs),
        "loops": storage.loop_devices_for(disks),
        "run_dirs": sorted(p.name for p in layout.run_dir.iterdir() if p != layout.neutral)
        if layout.run_dir.exists()
        else [],
        "machine_dirs": sorted(p.name for p in layout.machines.iterdir()),
    }


def settled(
    session: DriverSession, want: dict[str, object], keys: tuple[str, ...] = ()
) -> dict[str, object]:
    """The footprint once exited container inits are reaped: ``runc run -d`` leaves
    them to the host's init, which may take a moment (this VM's is lazy).
    ``keys``: the parts of it the caller compares (default: all); waiting for
    a part it does not compare would only wait out the deadline."""
    deadline = time.monotonic() + 15
    while True:
        now = footprint(session)
        if all(now[k] == want[k] for k in keys or want) or time.monotonic() > deadline:
            return now
        time.sleep(0.2)


def namespaces_of(pid: int) -> set[str]:
    return {os.readlink(f"/proc/{pid}/ns/{ns}") for ns in NAMESPACES}


def now_ticks() -> int:
    """Clock ticks since boot: the unit of /proc/<pid>/stat's start time."""
    return int(float(Path("/proc/uptime").read_text().split()[0]) * os.sysconf("SC_CLK_TCK"))


def started_at(pid: str) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def holders(inodes: set[str], started_before: int) -> list[int]:
    """Processes holding any of ``inodes`` that existed before ``started_before``.

    Namespace inode numbers are reused (the kernel hands out the lowest free
    one): a process started after the destroy that holds a same-numbered
    namespace holds a new namespace, made by some other sandbox on this host."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        start = started_at(entry.name)
        if start is None or start > started_before:
            continue
        for ns in NAMESPACES:
            try:
                if os.readlink(entry / "ns" / ns) in inodes:
                    found.append(int(entry.name))
                    break
            except OSError:
                break
    return found


def test_destroy_leaves_nothing(oci_session: DriverSession) -> None:
    driver, run = oci_session.driver, oci_session.run
    before = footprint(oci_session)
    specs = [small_spec() for _ in range(3)]
    inodes: set[str] = set()
    inits: list[int] = []
    for spec in specs:
        run(driver.create(spec))
        run(driver.start(spec.machine_id))
        state = driver.runc.state(spec.machine_id)  # type: ignore[attr-defined]
        inodes |= namespaces_of(state.pid) - namespaces_of(os.getpid())
        inits.append(state.pid)
    run(driver.suspend(specs[1].machine_id))
    run(driver.stop(specs[2].machine_id))
    assert len(inodes) >= 3 * 6  # every machine has its own (the net one is host-made)
    assert footprint(oci_session) != before
    destroying = now_ticks()
    for spec in specs:
        run(driver.destroy(spec.machine_id))
        assert run(driver.state(spec.machine_id)) is MachineState.ABSENT
    assert settled(oci_session, before) == before
    deadline = time.monotonic() + 15  # exited inits are reaped by the host's init
    while any(Path(f"/proc/{pid}").exists() for pid in inits) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [pid for pid in inits if Path(f"/proc/{pid}").exists()]
    assert holders(inodes, started_before=destroying) == []


def test_adopt_beside_a_start_leaves_the_new_machine_running(
    oci_session: DriverSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An adopt whose listing of records came before a machine's create (a
    control plane reconciling a node while it places sandboxes there) finds
    that machine's container without a record it listed: it runs on, not
    removed as an orphan (a cluster test's attach failed with a 500 so)."""
    driver, run = oci_session.driver, oci_session.run
    before = footprint(oci_session)
    spec = small_spec()
    run(driver.create(spec))
    run(driver.start(spec.machine_id))
    try:

        async def listed_before_the_create() -> list[object]:
            return []

        # The listing as it was before the create: the record is not in it.
        monkeypatch.setattr(driver, "_adopt_records", listed_before_the_create)
        run(driver.adopt())
        monkeypatch.undo()
        assert run(driver.state(spec.machine_id)) is MachineState.RUNNING
    finally:
        run(driver.destroy(spec.machine_id))
    assert settled(oci_session, before) == before


def test_gc_collects_a_crashed_node(oci_session: DriverSession) -> None:
    """Machines of a node killed mid-way are taken back or removed by ``podbay gc``."""
    driver, run, settings = oci_session.driver, oci_session.run, oci_session.settings
    before = footprint(oci_session)
    kept, broken = small_spec(), small_spec()
    for spec in (kept, broken):
        run(driver.create(spec))
        run(driver.start(spec.machine_id))
    # Simulate a create/destroy that died half-way: the record is gone, the rest is not.
    layout = driver.layout  # type: ignore[attr-defined]
    (layout.machine(broken.machine_id).home / "machine.json").unlink()
    # Disks a killed node was receiving: one long silent, one still being written.
    stale = layout.machines / f"{INCOMING_PREFIX}{small_spec().machine_id}-0badf00d"
    fresh = layout.machines / f"{INCOMING_PREFIX}{small_spec().machine_id}-5eedf00d"
    for partial in (stale, fresh):
        partial.mkdir()
        (partial / "disk.ext4").write_bytes(b"part of a disk")
    long_ago = time.time() - 2 * STALE_INCOMING_SECONDS
    for path in (stale / "disk.ext4", stale):
        os.utime(path, (long_ago, long_ago))
    env = {
        **os.environ,
        "PODBAY_RUNTIME_RUN_DIR": settings.runtime.run_dir,
        "PODBAY_RUNTIME_IMAGE_DIR": settings.runtime.image_dir,
    }
    argv = [sys.executable, "-m", "podbay.cli.main", "gc", "--data-dir", str(settings.data_dir)]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert broken.machine_id in done.stdout
    assert f"removed partial import {stale.name}" in done.stdout
    assert not stale.exists()
    assert fresh.exists()
    assert run(driver.state(kept.machine_id)) is MachineState.RUNNING
    done = subprocess.run([*argv, "--all"], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert run(driver.state(kept.machine_id)) is MachineState.ABSENT
    assert not fresh.exists()
    # gc --all also removes runc's state directory: the run directories differ.
    after = settled(oci_session, before, ("mounts", "processes", "loops", "machine_dirs"))
    assert after["mounts"] == before["mounts"]
    assert after["processes"] == before["processes"]
    assert after["loops"] == []
    assert after["machine_dirs"] == before["machine_dirs"]


def test_failed_start_leaves_nothing(oci_session: DriverSession, tmp_path: Path) -> None:
    """A start that fails half-way (here: a layer that does not exist, so the
    overlay mount fails while the network is being made) cleans up after itself."""
    driver, run = oci_session.driver, oci_session.run
    before = footprint(oci_session)
    spec = small_spec(layers=(tmp_path / "missing-layer",))
    run(driver.create(spec))
    with pytest.raises(DriverError):
        run(driver.start(spec.machine_id))
    assert run(driver.state(spec.machine_id)) is MachineState.STOPPED
    now = footprint(oci_session)
    assert now["mounts"] == before["mounts"]
    assert now["processes"] == before["processes"]
    assert now["loops"] == []
    assert now["cgroups"] == before["cgroups"]
    run(driver.destroy(spec.machine_id))
    assert settled(oci_session, before) == before
