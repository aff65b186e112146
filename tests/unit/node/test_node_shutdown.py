"""Shutting a node down closes every part whatever the one before met, and
says what failed (it used to be swallowed without a word)."""

from __future__ import annotations

from typing import Any

import pytest

from podbay.node.shutdown import release_machines

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Part:
    def __init__(self, name: str, fails: bool) -> None:
        self.name = name
        self.fails = fails
        self.closed = False

    async def close(self) -> None:
        self.closed = True
        if self.fails:
            raise OSError(f"{self.name} is stuck")


class Classes:
    def __init__(self, *drivers: Part) -> None:
        self.drivers = {d.name: d for d in drivers}


async def test_a_part_that_fails_to_close_is_logged_and_the_rest_close(
    caplog: pytest.LogCaptureFixture,
) -> None:
    environment = Part("environment", fails=True)
    broken, fine = Part("vm", fails=True), Part("gvisor", fails=False)
    routes = Part("routes", fails=False)
    classes: Any = Classes(broken, fine)
    await release_machines(classes, {}, routes, environment)  # type: ignore[arg-type]
    assert all(part.closed for part in (environment, broken, fine, routes))
    assert "closing the environment service failed" in caplog.text
    assert "closing the vm driver failed" in caplog.text
    assert "vm is stuck" in caplog.text
