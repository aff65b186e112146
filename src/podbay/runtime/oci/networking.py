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
import inspect
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

    def resolv_conf(self) -> str | None:
        return None

    def check_host(self) -> list[str]:
        return []


class ModuleNetwork(MachineNetwork):
    """Delegates to :mod:`podbay.runtime.oci.network`."""

    enabled = True

    def __init__(self, module: Any, settings: Settings, layout: Layout) -> None:
        self.module = module
        self.settings = settings
        self.layout = layout

    async def setup(self, run_dir: Path, machine_id: str) -> Path | None:
        result = self.module.setup(run_dir, machine_id)
        if inspect.isawaitable(result):
            result = await result
        return Path(result)

    async def teardown(self, run_dir: Path, machine_id: str) -> None:
        result = self.module.teardown(run_dir, machine_id)
        if inspect.isawaitable(result):
            await result

    def resolv_conf(self) -> str | None:
        text = getattr(self.module, "RESOLV_CONF", None)
        return text if isinstance(text, str) else "nameserver 10.0.2.3\n"

    def check_host(self) -> list[str]:
        check = getattr(self.module, "check_host", None)
        return list(check()) if check else []


def load_network(settings: Settings, layout: Layout) -> MachineNetwork:
    if not settings.runtime.network:
        return MachineNetwork()
    try:
        module = importlib.import_module("podbay.runtime.oci.network")
    except ImportError:
        log.warning("runtime.network is on but podbay.runtime.oci.network is missing: "
                    "sandboxes get loopback only")
        return MachineNetwork()
    if not hasattr(module, "setup"):
        return MachineNetwork()
    return ModuleNetwork(module, settings, layout)
