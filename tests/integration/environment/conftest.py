"""Declared environments end to end: a real ``podbay serve`` building real layers."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from podbay.testing.platform import PlatformServer

pytestmark = pytest.mark.root


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PlatformServer]:
    with PlatformServer.start(tmp_path_factory.mktemp("env-serve")) as s:
        yield s
