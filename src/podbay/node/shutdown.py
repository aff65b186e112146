"""What a process that runs sandboxes stops on shutdown, in order: the one
sequence for ``podbay serve``'s platform and for a ``podbay node``."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping

from podbay.dataplane.classes import ClassRuntimes
from podbay.dataplane.routes import RouteTable

from .pool import WarmPool

log = logging.getLogger("podbay.node")


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
        # Broad, here and below: each part closes whatever the one before met.
        try:
            await close_environment()
        except Exception:
            log.exception("closing the environment service failed")
    for driver in classes.drivers.values():
        try:
            await driver.close()
        except Exception:
            log.exception("closing the %s driver failed", driver.name)
