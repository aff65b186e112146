"""What the E2B test modules share: a real ``podbay serve`` per class (default
and ``container``), a key ``podbay deployment create --e2b-key`` printed, and
the SDK's options pointing at that server."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from podbay.testing.platform import PlatformServer, e2b_key


@pytest.fixture(scope="module", params=["gvisor", "container"])
def e2b_server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[PlatformServer]:
    with PlatformServer.start(
        tmp_path_factory.mktemp("e2b"), env={"PODBAY_RUNTIME_CLASSES": request.param}
    ) as s:
        yield s


@pytest.fixture(scope="module")
def e2b_opts(e2b_server: PlatformServer) -> dict[str, Any]:
    """The SDK's connection options for one deployment of ``e2b_server``."""
    key = e2b_key(e2b_server, "e2b-shared")
    return {"api_key": key, "api_url": e2b_server.base_url, "sandbox_url": e2b_server.base_url}
