"""Remove what crashed or half-destroyed machines left behind (``podbay gc``).

Safe while a node runs on the same data directory: it takes back live
machines with :meth:`OciDriver.adopt` first and only removes what belongs to
no machine record. With ``everything=True`` it destroys every machine too
(tests and uninstall).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import time
from collections.abc import Iterable

from podbay.host import records, storage
from podbay.host.layout import SHARED_RUN_ENTRIES

from ..machines import INCOMING_PREFIX, STALE_INCOMING_SECONDS, adopt_for_gc
from .driver import OciDriver


async def collect(
    driver: OciDriver, *, everything: bool = False, images_in_use: Iterable[str] = ()
) -> list[str]:
    """Clean up; one line per thing removed. ``images_in_use``: base images that
    machines of other drivers on the same image cache stand on (other classes)."""
    layout = driver.layout
    done, known = await adopt_for_gc(driver, everything=everything)
    # Machine directories without a record: creates that never finished.
    with contextlib.suppress(FileNotFoundError):
        for home in sorted(layout.machines.iterdir()):
            if home.name.startswith(INCOMING_PREFIX):
                if everything or _untouched_for(home, STALE_INCOMING_SECONDS):
                    storage.remove_tree(home)
                    done.append(f"removed partial import {home.name}")
                continue
            if home.is_dir() and records.read(home) is None:
                paths = layout.machine(home.name)
                await driver.release(home.name)
                storage.remove_tree(home)
                done.append(f"removed unfinished machine {home.name}")
                with contextlib.suppress(FileNotFoundError):
                    storage.remove_tree(paths.run)
    # Volatile directories of machines that no longer exist.
    with contextlib.suppress(FileNotFoundError):
        for run in sorted(layout.run_dir.iterdir()):
            # Not a machine's: the runtime's state, runsc's shared copies, another
            # class's volatile state (the vm driver's).
            if run.name in SHARED_RUN_ENTRIES or not run.is_dir() or run.name in known:
                continue
            await driver.release(run.name)
            leftover = layout.machine(run.name)
            storage.unmount_machine(leftover.rootfs, leftover.disk_mount)
            storage.remove_tree(run)
            done.append(f"removed leftovers of machine {run.name}")
    # Cgroups without a container. Processes left in one that no machine owns (its
    # record and run directory gone: a killed node's whose data directory was
    # removed) are killed, thawed first, or the cgroup could never go.
    for directory in driver.cgroups.existing(layout.cgroup_parent):
        for child in sorted(p for p in directory.iterdir() if p.is_dir()):
            if child.name in known and await driver.runc.query(child.name) is not None:
                continue
            path = f"{layout.cgroup_parent}/{child.name}"
            if everything or child.name not in known:
                await _end_processes(driver, path)
            if not driver.cgroups.remove(path):
                done.append(f"removed cgroup {child}")
    # The slirp4netns cgroups (``<parent>-net/<id>``) of machines that are gone.
    slirp_limits = driver.network.slirps.limits
    if slirp_limits is not None:
        done += driver.cgroups.remove_children(slirp_limits.cgroup_parent, known.__contains__)
    # Loop devices still backed by a disk file of no machine.
    disks = {str(p) for p in layout.machines.glob("*/disk.ext4")}
    mounted = {line.split()[0] for line in _read("/proc/self/mounts").splitlines()}
    for device in storage.loop_devices_for(disks | {d + ".tmp" for d in disks}):
        if device not in mounted:
            _clear_loop(device)
            done.append(f"detached {device}")
    done += _old_images(driver, set(images_in_use))
    if everything:
        storage.unmount_views(layout.neutral)
        with contextlib.suppress(OSError):
            (layout.neutral / storage.NEUTRAL_EMPTY).rmdir()
        with contextlib.suppress(OSError):
            layout.neutral.rmdir()
        driver.cgroups.remove(layout.cgroup_parent)
        if slirp_limits is not None:
            driver.cgroups.remove(slirp_limits.cgroup_parent)
        with contextlib.suppress(OSError):
            layout.runc_root.rmdir()
        with contextlib.suppress(OSError):
            layout.run_dir.rmdir()
    return done


async def _end_processes(driver: OciDriver, cgroup: str) -> None:
    """Kill what runs in ``cgroup`` and wait (briefly) until it has exited."""
    for _ in range(40):
        if not driver.cgroups.kill(cgroup):
            return
        await asyncio.sleep(0.05)


def _old_images(driver: OciDriver, keep: set[str]) -> list[str]:
    """Base images of older recipes that no machine of this data directory still
    stands on. Only when the image cache is this data directory's own: a shared
    cache (``runtime.image_dir``) may hold images other data directories use."""
    layout = driver.layout
    if not layout.image_dir.is_relative_to(layout.data_dir):
        return []
    keep = {driver.recipe.key(), *keep, *driver.images_in_use()}
    removed = []
    with contextlib.suppress(FileNotFoundError):
        for entry in sorted(layout.image_dir.iterdir()):
            if entry.is_dir() and not entry.name.startswith(".") and entry.name not in keep:
                shutil.rmtree(entry)
                removed.append(f"removed old base image {entry.name}")
    return removed


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def _clear_loop(device: str) -> None:
    import fcntl

    with contextlib.suppress(OSError):
        fd = os.open(device, os.O_RDWR | os.O_CLOEXEC)
        try:
            fcntl.ioctl(fd, 0x4C01)  # LOOP_CLR_FD
        finally:
            os.close(fd)


def _untouched_for(path: os.PathLike[str] | str, seconds: float) -> bool:
    """Whether nothing under ``path`` (itself and its files) changed for ``seconds``."""
    newest = 0.0
    for root, _, files in os.walk(path):
        for name in [".", *files]:
            with contextlib.suppress(OSError):
                newest = max(newest, os.stat(os.path.join(root, name)).st_mtime)
    return time.time() - newest >= seconds
