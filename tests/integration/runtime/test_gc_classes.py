"""``podbay gc`` over every OCI class: the container class owns the data
directory's image cache and keeps the base images gvisor machines stand on."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from podbay.host import records
from podbay.host.cgroups import Cgroups
from podbay.host.layout import Layout
from podbay.runtime.base import MachineState
from podbay.runtime.network import NetworkHandle
from podbay.testing.fixtures import cleanup, require_host, sandbox_settings, small_spec

pytestmark = pytest.mark.root


def gc(data_dir: Path, run_dir: str) -> list[str]:
    env = {**os.environ, "PODBAY_RUNTIME_RUN_DIR": run_dir}
    done = subprocess.run(
        [sys.executable, "-m", "podbay.cli.main", "gc", "--data-dir", str(data_dir), "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return list(json.loads(done.stdout)["removed"])


def test_an_old_image_a_gvisor_machine_stands_on_is_kept(tmp_path: Path) -> None:
    require_host()
    settings = sandbox_settings(tmp_path / "d")
    data_dir = settings.data_dir
    old = data_dir / "images" / "0ld1mage"
    (old / "rootfs").mkdir(parents=True)
    home = data_dir / "gvisor" / "machines" / "m-standing-on-old"
    home.mkdir(parents=True)
    records.write(
        home,
        records.MachineRecord(
            small_spec("m-standing-on-old"), MachineState.STOPPED, image="0ld1mage"
        ),
    )
    try:
        removed = gc(data_dir, settings.runtime.run_dir)
        assert old.is_dir(), removed
        assert not any("0ld1mage" in line for line in removed)
        (home / records.RECORD).unlink()
        removed = gc(data_dir, settings.runtime.run_dir)
        assert not old.exists()
        assert "removed old base image 0ld1mage" in removed
        assert "gvisor: removed unfinished machine m-standing-on-old" in removed
    finally:
        cleanup(settings)


def test_another_class_state_in_the_run_directory_is_not_a_leftover(tmp_path: Path) -> None:
    require_host()
    settings = sandbox_settings(tmp_path / "d")
    other = Path(settings.runtime.run_dir) / "vm"
    (other / "m-running-vm").mkdir(parents=True)
    (other / "m-running-vm" / "qmp.sock").touch()
    try:
        removed = gc(settings.data_dir, settings.runtime.run_dir)
        assert (other / "m-running-vm" / "qmp.sock").exists(), removed
        assert not any("vm" in line.split() for line in removed)
    finally:
        (other / "m-running-vm" / "qmp.sock").unlink()
        (other / "m-running-vm").rmdir()
        other.rmdir()
        cleanup(settings)


def test_vm_leftovers_that_can_never_be_used_again_are_removed(tmp_path: Path) -> None:
    require_host()
    from podbay.runtime.vm import disks, templates

    settings = sandbox_settings(tmp_path / "d")
    data_dir = settings.data_dir
    vm = data_dir / "vm"
    made_from = tmp_path / "kernel"
    made_from.touch()

    def template(key: str, inputs: list[Path] | None) -> Path:
        root = vm / "templates" / key
        root.mkdir(parents=True)
        if inputs is None:
            (root / "complete").touch()  # an older version's marker
        else:
            templates.mark_complete(root, inputs)
        return root

    usable = template("usable", [made_from])
    orphaned = template("orphaned", [made_from, tmp_path / "gone.cpio"])
    old_format = template("old-format", None)
    # Partial templates are named by their builder: a live one's (here, this
    # test process beside the gc command) stays, a dead one's goes.
    building = vm / "templates" / f".building.{os.getpid()}"
    building.mkdir()
    abandoned = vm / "templates" / ".abandoned.999999999"
    abandoned.mkdir()
    layer = data_dir / "layers" / "abc" / "rootfs"
    layer.mkdir(parents=True)
    (vm / "layers").mkdir()
    packed = vm / "layers" / f"{disks.layer_key(layer)}.ext4"
    packed.touch()
    unused = vm / "layers" / "0123456789abcdef0123.ext4"
    unused.touch()
    old = data_dir / "images" / "0ld1mage"
    (old / "rootfs").mkdir(parents=True)
    home = vm / "machines" / "m-vm-on-old"
    home.mkdir(parents=True)
    records.write(
        home,
        records.MachineRecord(small_spec("m-vm-on-old"), MachineState.STOPPED, image="0ld1mage"),
    )
    unfinished = vm / "machines" / "m-vm-half-made"
    unfinished.mkdir()
    # The cgroups a QEMU and its slirp4netns had, left by a node killed before
    # it removed them.
    parent = Layout.from_settings(settings).cgroup_parent
    cgroups = Cgroups()
    left = [f"{parent}-vm/m-vm-gone", f"{parent}-vm-net/m-vm-gone"]
    # ... and one a template build killed before its QEMU started left.
    left.append(f"{parent}-vm/tpl-0123456789ab")
    for path in left:
        cgroups.limit(path, memory_bytes=1 << 30, pids=64, cpus=1.0)
    try:
        removed = gc(data_dir, settings.runtime.run_dir)
        assert not any(cgroups.existing(path) for path in left), removed
        assert sum("vm: removed cgroup" in line for line in removed) == 2, removed
        assert usable.is_dir(), removed
        assert building.is_dir(), removed
        assert packed.exists(), removed
        assert not orphaned.exists()
        assert not old_format.exists()
        assert not unused.exists()
        assert not abandoned.exists()
        assert "vm: removed stale vm template orphaned" in removed
        assert "vm: removed stale vm template old-format" in removed
        assert f"vm: removed unused vm layer disk {unused.name}" in removed
        assert "vm: removed unfinished machine m-vm-half-made" in removed
        assert not unfinished.exists()
        assert old.is_dir(), removed
        assert home.is_dir(), removed  # the vm machine stands on it
    finally:
        for path in left:
            cgroups.remove(path.rsplit("/", 1)[0])
        cleanup(settings)


def test_the_network_of_a_vm_machine_that_no_longer_exists_is_reclaimed(tmp_path: Path) -> None:
    """A node killed mid-create, or a QEMU that crashed after its record went,
    leaves the machine's network (namespace, slirp4netns, its cgroup) under the
    vm driver's ``net/``; so does a template build whose builder died. gc takes
    them back; a live build's network stays (gc runs beside a live node)."""
    require_host()
    from podbay.runtime.network import netns, procscan
    from podbay.runtime.vm.driver import VmDriver

    settings = sandbox_settings(tmp_path / "d")
    vm = VmDriver(settings)
    # Partial templates are named by their builder: this process lives, 999999999 does not.
    (vm.home / "templates" / f".{'a' * 16}.{os.getpid()}").mkdir(parents=True)
    (vm.home / "templates" / f".{'b' * 16}.999999999").mkdir()
    ids = {"gone": "m-vm-gone", "dead build": f"tpl-{'b' * 12}", "live build": f"tpl-{'a' * 12}"}

    async def set_up() -> dict[str, NetworkHandle]:
        return {name: await vm.network.setup(machine_id) for name, machine_id in ids.items()}

    async def tear_down() -> None:
        for machine_id in ids.values():
            await vm.network.teardown(machine_id)
        await vm.network.close()

    handles = asyncio.run(set_up())
    cgroups = Cgroups()

    def present(handle: NetworkHandle) -> list[bool]:
        assert handle.slirp_pid is not None
        return [
            netns.is_mounted(handle.netns_path),
            procscan.alive(handle.slirp_pid),
            bool(cgroups.existing(vm.network.slirps.cgroup(handle.machine_id))),
        ]

    try:
        assert all(all(present(h)) for h in handles.values())
        removed = gc(settings.data_dir, settings.runtime.run_dir)
        assert "vm: removed network of machine m-vm-gone" in removed
        for name in ("gone", "dead build"):
            assert present(handles[name]) == [False, False, False], (name, removed)
            assert not handles[name].netns_path.parent.exists()
        assert present(handles["live build"]) == [True, True, True], removed
    finally:
        asyncio.run(tear_down())
        cleanup(settings)
