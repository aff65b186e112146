"""Waiting on a file descriptor from asyncio: a pipe's ready byte, a pidfd's exit."""

from __future__ import annotations

import asyncio


async def wait_readable(fd: int, within: float | None = None) -> bool:
    """True once ``fd`` is readable; False if ``within`` seconds pass first.

    A pidfd turns readable when its process exits; a pipe when it has data or
    its writer is gone."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()

    def ready() -> None:
        if not done.done():
            done.set_result(None)

    loop.add_reader(fd, ready)
    try:
        await asyncio.wait_for(done, within)
        return True
    except TimeoutError:
        return False
    finally:
        loop.remove_reader(fd)
