"""A ``vm`` driver on its own event loop, for synchronous tests (TCG only).

Tests never try KVM: where ``/dev/kvm`` exists but guests hang, it would stall
the suite. Every machine of the session is destroyed at the end.
"""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import pytest

from podbay.runtime.base import MachineSpec
from podbay.settings import Settings

from .fixtures import (
    end_vm_driver,
    forget_run_dir,
    mark_owner,
    require_host,
    sandbox_settings,
    sweep_dead_sessions,
)

T = TypeVar("T")


def vm_host_problem() -> str | None:
    """Why this host cannot run ``vm`` machines, or ``None``."""
    if shutil.which("qemu-system-x86_64") is None:
        return "needs qemu-system-x86"
    if not list(Path("/boot").glob("vmlinuz-*-cloud-amd64")):
        return "needs linux-image-cloud-amd64"
    if not Path("/usr/bin/busybox").exists() and not Path("/bin/busybox").exists():
        return "needs busybox-static"
    return None


class VmSession:
    def __init__(self, settings: Settings) -> None:
        from podbay.runtime.vm.driver import VmDriver

        self.settings = settings
        self.runner = asyncio.Runner()
        self.driver = VmDriver(settings)

    @classmethod
    def open(cls, data_dir: Path, **runtime: Any) -> VmSession:
        """A prepared session on ``data_dir`` (``runtime``: settings to change);
        fails the test where the host cannot run ``vm`` machines (a suite that
        skipped them proves nothing)."""
        require_host()
        sweep_dead_sessions()
        problem = vm_host_problem()
        if problem is not None:
            pytest.fail(f"this host cannot run vm sandboxes: {problem}")
        settings = sandbox_settings(data_dir, **runtime)
        mark_owner(settings)
        session = cls(settings)
        session.run(session.driver.prepare())
        return session

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.runner.run(coro)

    def up(self, spec: MachineSpec) -> str:
        self.run(self.driver.create(spec))
        self.run(self.driver.start(spec.machine_id))
        return spec.machine_id

    def close(self) -> None:
        try:
            self.run(end_vm_driver(self.driver))
        finally:
            self.runner.close()
            forget_run_dir(self.settings)
