"""A class proved after start-up is reported available on /healthz only once its
machines are taken up (routes published, resumes done): a client that waits
for it there then finds its old sandboxes answering."""

from __future__ import annotations

import asyncio
from typing import Any

from podbay.dataplane.classes import ClassRuntimes
from podbay.runtime.base import Driver
from podbay.runtime.classes import HostCheck


def test_a_class_is_available_on_healthz_only_after_its_machines_are_taken_up() -> None:
    async def main() -> None:
        drivers: dict[str, Any] = {"gvisor": object(), "container": object()}
        classes = ClassRuntimes(("gvisor", "container"), drivers)
        seen_during: list[list[str]] = []
        taken_up = asyncio.Event()

        async def check(name: str, driver: Driver) -> HostCheck:
            return HostCheck(True, True, "prepared")

        async def prove(name: str, driver: Driver) -> str:
            return "a sandbox answered"

        async def later(name: str) -> None:
            available = classes.describe()["available"]
            assert isinstance(available, list)
            seen_during.append(list(available))
            taken_up.set()

        await classes.start(check, prove, later=later)
        await asyncio.wait_for(taken_up.wait(), 10)
        await classes.close()
        assert seen_during == [["gvisor"]]  # container not yet, while taken up
        assert classes.describe()["available"] == ["gvisor", "container"]

    asyncio.run(main())
