"""``podbay gc``: remove what crashed or destroyed sandboxes left behind.

Live machines are taken back (adopted), never touched; what belongs to no
machine (half-created directories, mounts, cgroups, loop devices, runc
containers) is removed. ``--all`` destroys every machine of the data
directory first, then every cache of the data directory (base images,
layers, the agent bundle, logs: :mod:`podbay.cli.uninstall`), keeping and
naming only the deployments and the signing keys: for tests and uninstalling
(refused while a server runs on the directory). Each OCI class (``container``,
and ``gvisor`` and ``vm`` where they have data) is collected in its own
directories; the vm class also drops templates and packed layer disks that
can never be used again.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import click

from podbay.cli.options import data_dir_option, json_option
from podbay.cli.output import Output, fail


@click.command()
@click.option(
    "--all", "everything", is_flag=True, help="Destroy every sandbox of this data directory too."
)
@data_dir_option("Data directory (default /var/lib/podbay as root).")
@json_option()
def command(everything: bool, data_dir: Path | None, as_json: bool) -> None:
    """Remove what dead sandboxes left behind."""
    from podbay.runtime.base import DriverError
    from podbay.runtime.classes import CONTAINER, GVISOR, VM, class_settings
    from podbay.runtime.oci import gc
    from podbay.runtime.oci.driver import OciDriver
    from podbay.settings import Settings

    out = Output(as_json=as_json)
    settings = Settings.load(data_dir=data_dir)
    if everything:
        from podbay.cli.uninstall import servers_on

        running = servers_on(settings.data_dir)
        if running:
            fail(
                f"podbay serve runs on {settings.data_dir} (pid {running[0]}): "
                "stop it first (gc --all removes what it stands on)"
            )

    async def main() -> list[str]:
        done: list[str] = []
        # vm and gvisor first: the container class owns the shared image cache,
        # and must keep the base images their machines still stand on.
        in_use: set[str] = set()
        if (settings.data_dir / VM).is_dir():
            from podbay.runtime.vm import gc as vm_gc
            from podbay.runtime.vm.driver import VmDriver

            vm = VmDriver(settings)
            try:
                found = await vm_gc.collect(
                    vm, everything=everything, layer_cache=settings.layer_dir
                )
                done += [f"{VM}: {line}" for line in found]
                in_use |= vm.images_in_use()
            finally:
                await vm.close()
        for name in (GVISOR, CONTAINER):
            derived = class_settings(settings, name)
            if name != CONTAINER and not derived.data_dir.exists():
                continue
            driver = OciDriver(derived)
            try:
                prefix = "" if name == CONTAINER else f"{name}: "
                done += [
                    prefix + line
                    for line in await gc.collect(
                        driver, everything=everything, images_in_use=in_use
                    )
                ]
                in_use |= driver.images_in_use()
            finally:
                await driver.close()
        return done

    kept: list[str] = []
    try:
        done = asyncio.run(main())
        if everything:
            from podbay.cli.uninstall import clear

            cleared, kept = clear(settings.data_dir)
            done += cleared
    except (DriverError, OSError) as e:
        fail(f"gc failed: {e}")
    text = "\n".join(done) if done else "nothing to remove"
    if kept:
        text += "\n" + "\n".join(kept)
        text += f"\nto uninstall: rm -rf {settings.data_dir} (see README: Uninstall)"
    out.value({"removed": done, "kept": kept} if everything else {"removed": done}, text)
