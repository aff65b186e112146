"""The driver's seam to sandbox networking.

:mod:`podbay.runtime.oci.network` (its own module, owned separately) builds a
host-owned network namespace per machine with filtering and slirp4netns.
This adapter is all the driver sees: ``setup`` returns the namespace path
for ``config.json`` (``None``: a fresh loopback-only namespace), ``teardown``
undoes it, ``resolv_conf`` is the sandbox's ``/etc/resolv.conf``. When the
network module is absent or ``runtime.network`` is off, machines get
loopback only.
"""

from __future__ import annotations

import importlib
import logging
from pathlib import Path
from typing import Any

from ...settings import Settings
from .layout import Layout

log = logging.getLogger("podbay.runtime.oci")


class MachineNetwork:
    """Loopback only: nothing to set up."""

    enabled = False

    async def setup(self, run_dir: Path, machine_id: str) -> Path | None:
        return None

    async def teardown(self, run_dir: Path, machine_id: str) -> None:
        return None

    async def adopt(self, machine_id: str) -> bool:
        """Take back a live machine's network after a restart; ``False`` if it is gone."""
        return True

    def resolv_conf(self) -> str | None:
        return None

    def check_host(self) -> list[str]:
        return []

    async def close(self) -> None:
        return None


class ModuleNetwork(MachineNetwork):
    """Delegates to :class:`podbay.runtime.oci.network.NetworkManager`, which keeps
    its state (``netns``, ``slirp.pid``) in the same ``<run_dir>/<machine_id>/``."""

    def __init__(self, manager: Any) -> None:
        self.manager = manager
        self.enabled = bool(manager.enabled)

    async def setup(self, run_dir: Path, machine_id: str) -> Path | None:
        handle = await self.manager.setup(machine_id)
        return Path(handle.netns_path)

    async def teardown(self, run_dir: Path, machine_id: str) -> None:
        await self.manager.teardown(machine_id)

    async def adopt(self, machine_id: str) -> bool:
        return await self.manager.adopt(machine_id) is not None

    def resolv_conf(self) -> str | None:
        return str(self.manager.resolv_conf())

    def check_host(self) -> list[str]:
        return list(self.manager.check_host())

    async def close(self) -> None:
        await self.manager.close()


def load_network(settings: Settings, layout: Layout) -> MachineNetwork:
    """The network module's manager over ``layout.run_dir``; loopback-only when
    the module is not installed."""
    try:
        module = importlib.import_module("podbay.runtime.oci.network")
        manager_class = module.NetworkManager
    except (ImportError, AttributeError):
        log.warning("podbay.runtime.oci.network is missing: sandboxes get loopback only")
        return MachineNetwork()
    return ModuleNetwork(manager_class(layout.run_dir, enabled=settings.runtime.network))
