"""Real ``podbay serve`` subprocesses with real sandboxes (oci driver)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from podbay.testing.platform import PlatformServer

pytestmark = pytest.mark.root


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PlatformServer]:
    """One server for the tests that need no special settings."""
    with PlatformServer.start(
        tmp_path_factory.mktemp("serve"),
        env={
            "PODBAY_CAPS_PER_DEPLOYMENT": "3",
            "PODBAY_CAPS_PER_ACCOUNT": "5",
        },
    ) as s:
        yield s


@pytest.fixture(scope="session")
def token(server: PlatformServer) -> str:
    return server.create_deployment("main-agent")


@pytest.fixture
def make_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator:  # type: ignore[type-arg]
    """Start servers with their own settings; all closed at the end of the test."""
    started: list[PlatformServer] = []

    def make(env: dict[str, str] | None = None, wait: bool = True) -> PlatformServer:
        s = PlatformServer.start(tmp_path_factory.mktemp("serve"), env=env, wait=wait)
        started.append(s)
        return s

    yield make
    for s in started:
        s.close()
