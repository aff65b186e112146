"""The driver's templates at work: which machines restore from one, building
a template in the background, restoring a machine from it, and clearing what
a killed build left behind.

:mod:`.templates` holds the on-disk format (key, ``complete``, save, kill);
this module holds the jobs that need a driver to boot a guest, so the driver
keeps only its own lifecycle and hands these to the :class:`TemplateBuilder`
it holds.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import logging
import os
import shlex
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

from podbay.host import storage
from podbay.host.cgroups import Cgroups
from podbay.host.layout import Layout
from podbay.host.tools import check_tool
from podbay.settings import RuntimeSettings

from ..base import Limits, MachineSpec
from ..machines import uts_name
from ..network import NetworkManager
from . import qmp, templates
from .budget import guest_cpus, guest_mib
from .qemu import AGENT_OPTIONS, VmPaths
from .relay import Relay, RelayLoop

log = logging.getLogger("podbay.runtime.vm")


class GuestHost(Protocol):
    """What a template needs of the driver that holds it (:class:`~.driver.VmDriver`):
    its places and parts, and how it boots a guest."""

    home: Path
    run_root: Path
    rt: RuntimeSettings
    accel: str
    layout: Layout
    network: NetworkManager
    cgroups: Cgroups
    cgroup_parent: str
    relay_loop: RelayLoop

    def argv(
        self,
        spec: MachineSpec,
        paths: VmPaths,
        layers: list[Path],
        *,
        network: bool,
        initrd: Path | None = None,
    ) -> list[str]: ...

    async def launch(self, spec: MachineSpec, argv: list[str]) -> None: ...

    def boot_files(
        self,
        paths: VmPaths,
        config: dict[str, object],
        env: Mapping[str, str],
        hostname: str,
        resolv_conf: str,
        layers: int,
        network: bool,
    ) -> None: ...

    async def drop_cgroup(self, machine_id: str) -> None: ...

    async def start_relay(self, machine_id: str, paths: VmPaths) -> Relay: ...

    def boot_inputs(self, layers: list[Path]) -> list[Path]: ...


class TemplateBuilder:
    """Templates of one :class:`VmDriver`: under ``<data>/vm/templates`` (see
    :mod:`.templates`), built on the driver's relay loop."""

    def __init__(self, driver: GuestHost) -> None:
        self.driver = driver
        self.home = driver.home / "templates"
        self.run_root = driver.run_root / "templates"
        self._building: set[str] = set()
        self._builds: list[concurrent.futures.Future[None]] = []

    def shape(self, spec: MachineSpec) -> templates.Shape:
        return templates.Shape(
            memory_mib=guest_mib(spec),
            cpus=guest_cpus(spec),
            disk_bytes=spec.limits.disk_bytes,
            network=self.driver.network.enabled,
        )

    def fits(self, spec: MachineSpec) -> bool:
        """Whether the machine has the server's own CPUs and memory: only that
        shape restores from a template. One of attach's own (cpus, memory_mib)
        boots cold: a template is a guest's saved memory on disk, and sandboxes
        could ask for as many shapes as the bounds allow."""
        rt = self.driver.rt
        return spec.limits.memory_bytes == rt.memory_bytes and spec.limits.cpus == rt.cpus

    def ensure(self, shape: templates.Shape, layers: list[Path]) -> templates.Template | None:
        """The template of this shape and these layer disks if it is ready; else
        start building it (once)."""
        key = shape.key(self.driver.accel, *map(str, self.driver.boot_inputs(layers)))
        template = templates.find(self.home, key)
        if template is None and key not in self._building:
            self._building.add(key)
            self._builds.append(self.driver.relay_loop.submit(self.build(key, shape, layers)))
        return template

    async def wait(self, within: float) -> None:
        """Until every template being built is ready (or failed)."""
        pending = [asyncio.wrap_future(b) for b in self._builds if not b.done()]
        if pending:
            await asyncio.wait(pending, timeout=within)

    async def cancel(self) -> None:
        """Abandon the builds still running: their guests are killed."""
        waits = [asyncio.wrap_future(build) for build in self._builds]
        for build in self._builds:
            build.cancel()
        # asyncio.wait, not a suppressed await: the builds' own ends (cancelled)
        # are theirs, but a cancellation of the caller still reaches the caller.
        if waits:
            await asyncio.wait(waits, timeout=30)
        self._builds.clear()

    async def clear_leftovers(self) -> None:
        """Template guests a killed node was building (their QEMU, network, files).
        Builds of a live process on this data directory (this one, or a node
        beside ``podbay gc``) are left alone: a partial is ``.<key>.<builder pid>``."""
        driver = self.driver
        # Listed before the builds: a build's partial comes before its network
        # and outlives it, so one listed here whose build lives is seen live.
        networks = [m for m in driver.network.machines() if m.startswith("tpl-")]
        partials = list(self.home.glob(".*"))
        live = set(self._building)
        for partial in partials:
            key, _, pid = partial.name[1:].rpartition(".")
            if pid.isdigit() and int(pid) != os.getpid() and running(int(pid)):
                live.add(key)

        def dead(machine_id: str) -> bool:
            return not any(key.startswith(machine_id[4:]) for key in live)

        for pidfile in self.run_root.glob("*/qemu.pid"):
            run = pidfile.parent
            if not dead(f"tpl-{run.name}"):
                continue
            templates.kill(pidfile, f"unix:{run / 'qmp.sock'},")
            await driver.drop_cgroup(f"tpl-{run.name}")
            with contextlib.suppress(Exception):
                await driver.network.teardown(f"tpl-{run.name}")
            shutil.rmtree(run, ignore_errors=True)
        # A build killed before its QEMU wrote a pid file left its cgroup, and
        # its network if it had set that up.
        for directory in driver.cgroups.existing(driver.cgroup_parent):
            for child in directory.glob("tpl-*"):
                if dead(child.name):
                    await driver.drop_cgroup(child.name)
        for machine_id in filter(dead, networks):
            with contextlib.suppress(Exception):
                await driver.network.teardown(machine_id)
        for partial in partials:
            if partial.name[1:].rpartition(".")[0] not in live:
                shutil.rmtree(partial, ignore_errors=True)

    async def restore(
        self,
        spec: MachineSpec,
        paths: VmPaths,
        layers: list[Path],
        template: templates.Template,
        *,
        network: bool,
    ) -> None:
        """Start the machine from a template's saved state (see templates.py)."""
        driver = self.driver
        await _copy_sparse(template.disk, paths.disk_image)
        argv = [
            *driver.argv(spec, paths, layers, network=network, initrd=template.initrd),
            "-incoming",
            f"exec:cat {shlex.quote(str(template.state))}",
        ]
        await driver.launch(spec, argv)
        await templates.wait_incoming(paths.qmp, 120.0)
        relay = await driver.start_relay(spec.machine_id, paths)
        await qmp.execute(paths.qmp, "cont")
        await driver.relay_loop.call(relay.set_clock())  # the template's is its build's
        config = {
            "hostname": uts_name(spec.hostname),
            "pids": spec.limits.pids,
            "env": dict(spec.env),
        }
        await driver.relay_loop.call(relay.configure(json.dumps(config).encode(), 30.0))

    async def build(self, key: str, shape: templates.Shape, layers: list[Path]) -> None:
        """Boot a template guest, save it, and keep it under ``templates/<key>``
        (runs on the relay loop, beside whatever the caller's loop does)."""
        driver = self.driver
        root = self.home / key
        tmp = root.with_name(f".{key}.{os.getpid()}")
        machine_id = f"tpl-{key[:12]}"
        paths = VmPaths(tmp, self.run_root / key[:12])
        spec = MachineSpec(
            machine_id=machine_id,
            hostname="sandbox",
            limits=Limits(
                memory_bytes=shape.memory_mib << 20,
                cpus=float(shape.cpus),
                pids=1 << 16,
                disk_bytes=shape.disk_bytes,
            ),
        )
        relay: Relay | None = None
        try:
            async with asyncio.timeout(templates.BUILD_SECONDS):
                shutil.rmtree(tmp, ignore_errors=True)
                tmp.mkdir(parents=True)
                paths.run.mkdir(parents=True, exist_ok=True)
                await storage.make_disk(
                    paths.disk_image, shape.disk_bytes, driver.layout.data_dir / "disks"
                )
                handle = await driver.network.setup(machine_id)
                config: dict[str, object] = {
                    "hostname": "sandbox",
                    "pids": 1 << 16,
                    "agent_options": AGENT_OPTIONS,
                    "template": True,
                }
                await asyncio.to_thread(
                    driver.boot_files,
                    paths,
                    config,
                    {},
                    "sandbox",
                    handle.resolv_conf,
                    len(layers),
                    handle.enabled,
                )
                await driver.launch(spec, driver.argv(spec, paths, layers, network=handle.enabled))
                relay = Relay(machine_id, paths.socket, paths.mux, fresh=True)
                await relay.start()
                await relay.waiting.wait()
                await relay.close()
                relay = None
                await templates.save(paths.qmp, tmp / "state")
                templates.kill(paths.pidfile, f"unix:{paths.qmp},")
                shutil.copyfile(paths.initrd, tmp / "initrd")
                templates.mark_complete(tmp, driver.boot_inputs(layers))
                os.rename(tmp, root)
                log.info(
                    "vm template %s ready (%d MiB, %d cpus)", key, shape.memory_mib, shape.cpus
                )
        # Broad: a template is an optimisation (a machine without one boots cold),
        # so whatever a build met is logged (with its trace) and the node goes on;
        # cancellation is not caught (a BaseException).
        except Exception as e:
            log.warning("vm template %s not built: %s", key, e or type(e).__name__, exc_info=True)
        finally:
            if relay is not None:
                await relay.close()
            templates.kill(paths.pidfile, f"unix:{paths.qmp},")
            await driver.drop_cgroup(machine_id)
            with contextlib.suppress(Exception):
                await driver.network.teardown(machine_id)
            shutil.rmtree(paths.run, ignore_errors=True)
            templates.discard(tmp)
            self._building.discard(key)


async def _copy_sparse(source: Path, target: Path) -> None:
    await check_tool(
        "cp",
        "--sparse=always",
        "--reflink=auto",
        str(source),
        str(target),
        failed="copying the template's disk failed",
    )


def running(pid: int) -> bool:
    """Alive and not a zombie: a daemonised QEMU's parent is the host's init,
    which may take seconds to reap it (its files and memory are released at
    exit already)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            state = stat.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in (b"Z", b"X")
