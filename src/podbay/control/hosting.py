"""What a process that runs sandboxes stops on shutdown, in order: the one
sequence for ``podbay serve``'s platform and for a ``podbay node``."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping

from podbay.gateway.routes import RouteTable

from .services.classes import ClassRuntimes
from .services.pool import WarmPool


async def stop_tasks(classes: ClassRuntimes, tasks: list[asyncio.Task[None]]) -> None:
    """Stop proving classes and every background task (cancelled, awaited, forgotten)."""
    await classes.close()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    tasks.clear()


async def release_machines(
    classes: ClassRuntimes, pools: Mapping[str, WarmPool], routes: RouteTable, environment: object
) -> None:
    """Destroy the warm pools' machines, close the relays, the environment
    service and the drivers (their sandboxes keep running)."""
    for pool in pools.values():
        await pool.close(destroy=True)
    await routes.close()
    close_environment = getattr(environment, "close", None)
    if close_environment is not None:
        with contextlib.suppress(Exception):
            await close_environment()
    for driver in classes.drivers.values():
        with contextlib.suppress(Exception):
            await driver.close()
