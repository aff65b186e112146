"""The client against a real platform: ``podbay serve`` (the real
``create_app``, gateway and agent) with real sandboxes.

``podbay.testing.platform.PlatformServer`` starts it once per session (root,
runc and the base image; skipped where the host cannot run sandboxes, failed
under ``PODBAY_TEST_REQUIRE_SANDBOXES=1``). ``PODBAY_TEST_SERVER_URL`` plus
``PODBAY_TEST_TOKEN`` use an already running server instead.
"""

from __future__ import annotations

import contextlib
import functools
import os
import uuid
from collections.abc import Iterator
from typing import Any

import anyio.from_thread
import pytest

from podbay.client import AsyncSandboxClient, SandboxClient


class RealServer:
    def __init__(self, url: str, token: str) -> None:
        self.url = url
        self.token = token


@pytest.fixture(scope="session")
def platform(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealServer]:
    url, token = os.environ.get("PODBAY_TEST_SERVER_URL"), os.environ.get("PODBAY_TEST_TOKEN")
    if url and token:
        yield RealServer(url, token)
        return
    from podbay.testing.platform import PlatformServer

    with PlatformServer.start(tmp_path_factory.mktemp("serve-client")) as server:
        yield RealServer(server.base_url, server.create_deployment("client-tests"))


@pytest.fixture
def name(platform: RealServer) -> Iterator[str]:
    """A fresh sandbox name, deleted afterwards."""
    sandbox = f"it-{uuid.uuid4().hex[:10]}"
    yield sandbox
    with (
        SandboxClient(identity_token=platform.token, server_url=platform.url) as client,
        contextlib.suppress(Exception),
    ):  # never created, or already gone
        client.delete(sandbox)


class Blocking:
    """An async client's methods called from sync test code, on one event loop."""

    def __init__(self, client: AsyncSandboxClient, portal: Any) -> None:
        self._client = client
        self._portal = portal

    def __getattr__(self, attr: str) -> Any:
        value = getattr(self._client, attr)
        if not callable(value):
            return value
        return lambda *a, **k: self._portal.call(functools.partial(value, *a, **k))


@pytest.fixture(params=["sync", "async"])
def face(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def make_client(face: str, platform: RealServer) -> Iterator[Any]:
    closers: list[Any] = []
    with anyio.from_thread.start_blocking_portal() as portal:

        def make(**options: Any) -> Any:
            options.setdefault("identity_token", platform.token)
            options.setdefault("server_url", platform.url)
            if face == "sync":
                client: Any = SandboxClient(**options)
                closers.append(client.close)
                return client
            aclient = AsyncSandboxClient(**options)
            closers.append(lambda: portal.call(aclient.aclose))
            return Blocking(aclient, portal)

        yield make
        for close in closers:
            close()


@pytest.fixture
def client(make_client: Any) -> Any:
    return make_client()
