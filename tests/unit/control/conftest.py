from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from platform_harness import Harness, build_harness


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
async def harness(tmp_path: Path) -> AsyncIterator[Harness]:
    async with build_harness(tmp_path) as h:
        yield h
