"""Operator commands' one way to work on the store the settings name."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

from podbay.cli.output import fail

if TYPE_CHECKING:  # the CLI imports the server's modules only when a command runs
    from podbay.settings import Settings
    from podbay.store.base import Store

T = TypeVar("T")


def run_on_store(settings: Settings, work: Callable[[Store], Awaitable[T]]) -> T:
    """Open the store (exit 2 with why when it cannot be), run ``work`` on it,
    close it."""
    from podbay.store.opening import open_store

    async def main() -> T:
        try:
            store = open_store(settings)
        except ValueError as exc:
            fail(str(exc), 2)
        try:
            return await work(store)
        finally:
            await store.close()

    return asyncio.run(main())
