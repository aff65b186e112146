"""Remove what the ``vm`` class left behind (``podbay gc``).

Like the OCI classes' collection (``runtime/oci/gc.py``) it first takes back
live machines (:meth:`VmDriver.adopt`), so it is safe beside a running node,
and removes only what belongs to no machine record. What only the vm class
accumulates:

- templates (saved booted guests, one per machine shape and layer set) that
  can never be restored again: made by another template version, or from a
  kernel, initramfs, base disk or layer disk that is gone;
- packed layer disks (``vm/layers/<key>.ext4``) of layers that no longer exist
  in the layer cache and that no machine record names;
- the host cgroups of QEMUs and slirp4netns that are gone (a node killed
  between a kill and the removal);
- the networks (namespace, slirp4netns, its cgroup) of machines that no
  longer exist: the driver keeps them under ``net/``, apart from each
  machine's run directory.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterable
from pathlib import Path

from ..machines import adopt_for_gc
from . import disks, templates
from .driver import VmDriver
from .qemu import VmPaths


async def collect(
    driver: VmDriver, *, everything: bool = False, layer_cache: Path | None = None
) -> list[str]:
    """Clean up; one line per thing removed. ``layer_cache``: the declared
    environments' layer directory (``<data>/layers``), whose layers stay packed."""
    done, known = await adopt_for_gc(driver, everything=everything)
    with contextlib.suppress(FileNotFoundError):
        for home in sorted(p for p in driver.machines.iterdir() if p.is_dir()):
            if home.name not in known:
                await driver.release(home.name)  # a create that never finished
                shutil.rmtree(home, ignore_errors=True)
                shutil.rmtree(driver.run_root / home.name, ignore_errors=True)
                done.append(f"removed unfinished machine {home.name}")
    # Networks of machines that no longer exist (a node killed mid-create or
    # mid-destroy, a QEMU that crashed after its record went) live apart from
    # their run directories (``net/<id>``). ``release`` ends the QEMU first (its
    # pid file is still there), then its cgroup, slirp4netns and namespace. A
    # template build's (``tpl-``) are left to adopt's clearing of dead builds.
    for machine_id in driver.network.machines():
        if machine_id in known or machine_id.startswith("tpl-"):
            continue
        if (driver.machines / machine_id).exists():
            continue  # created since adopt looked: a record comes before a network
        await driver.release(machine_id)
        done.append(f"removed network of machine {machine_id}")
    with contextlib.suppress(FileNotFoundError):
        for run in sorted(p for p in driver.run_root.iterdir() if p.is_dir()):
            if run.name in known or run.name in ("templates", "net"):
                continue
            paths = VmPaths(driver.machines / run.name, run)
            templates.kill(paths.pidfile, f"unix:{paths.qmp},")
            shutil.rmtree(run, ignore_errors=True)
            done.append(f"removed leftovers of machine {run.name}")
    done += _stale_templates(driver.home / "templates")
    done += _unused_layer_disks(driver, layer_cache)
    done += _empty_cgroups(driver, known, everything=everything)
    return done


def _empty_cgroups(driver: VmDriver, known: set[str], *, everything: bool) -> list[str]:
    """The cgroups of QEMUs and slirp4netns of no machine. A template guest's
    (``tpl-``) are left to adopt's clearing of dead builds (``adopt_for_gc``
    ran it): a live build makes its cgroup a moment before its QEMU enters it."""
    removed = []
    limits = driver.network.slirps.limits
    parents = [driver.cgroup_parent] + ([limits.cgroup_parent] if limits else [])
    for parent in parents:
        removed += driver.cgroups.remove_children(
            parent, lambda name: name in known or name.startswith("tpl-")
        )
        if everything:
            driver.cgroups.remove(parent)
    return removed


def _stale_templates(directory: Path) -> list[str]:
    removed = []
    with contextlib.suppress(FileNotFoundError):
        for root in sorted(directory.iterdir()):
            if root.name.startswith("."):
                continue  # being built (or a killed build: adopt cleared those)
            if templates.stale(templates.Template(root)):
                templates.discard(root)
                removed.append(f"removed stale vm template {root.name}")
    return removed


def _unused_layer_disks(driver: VmDriver, layer_cache: Path | None) -> list[str]:
    keep = {_key(layer) for layer in _layers(driver, layer_cache)} - {None}
    removed = []
    with contextlib.suppress(FileNotFoundError):
        for packed in sorted((driver.home / "layers").glob("*.ext4")):
            if packed.stem not in keep:
                packed.unlink(missing_ok=True)
                removed.append(f"removed unused vm layer disk {packed.name}")
    return removed


def _layers(driver: VmDriver, layer_cache: Path | None) -> Iterable[Path]:
    """Every layer a machine may still boot with: the cache's and the records'."""
    if layer_cache is not None:
        with contextlib.suppress(FileNotFoundError):
            yield from (p / "rootfs" for p in layer_cache.iterdir() if p.is_dir())
    for record in driver.machine_records():
        yield from record.spec.layers


def _key(layer: Path) -> str | None:
    try:
        return disks.layer_key(layer) if os.path.isdir(layer) else None
    except OSError:
        return None
