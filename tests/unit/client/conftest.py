"""Fixtures: a fake platform and the client under test, in both faces.

``client`` is a SandboxClient, or an AsyncSandboxClient driven through an
anyio blocking portal (one event loop for the whole test) behind the same
blocking interface, so every test runs against both faces unchanged.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

import anyio.from_thread
import httpx
import pytest
from fakeplatform import SERVER, Fake

from podbay.client import AsyncSandboxClient, SandboxClient


class Blocking:
    """Calls an async client's methods from sync test code."""

    def __init__(self, client: AsyncSandboxClient, portal: Any) -> None:
        self._client = client
        self._portal = portal

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._client, name)
        if not callable(attr) or name == "sandbox":
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            return self._portal.call(functools.partial(attr, *args, **kwargs))

        return call


@pytest.fixture
def fake(tmp_path: Any) -> Iterator[Fake]:
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    fake = Fake(workspace)
    yield fake
    fake.close()


@pytest.fixture(params=["sync", "async"])
def face(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def make_client(face: str, fake: Fake) -> Iterator[Any]:
    """``make_client(**options)``: a client of the current face on the fake."""
    made: list[Any] = []
    with anyio.from_thread.start_blocking_portal() as portal:

        def make(**options: Any) -> Any:
            options.setdefault("identity_token", fake.token)
            if face == "sync":
                client: Any = SandboxClient(transport=httpx.MockTransport(fake), **options)
                made.append(client.close)
                return client
            aclient = AsyncSandboxClient(transport=httpx.MockTransport(fake), **options)
            made.append(lambda: portal.call(aclient.aclose))
            return Blocking(aclient, portal)

        yield make
        for close in made:
            close()


@pytest.fixture
def client(make_client: Any) -> Any:
    return make_client()


__all__ = ["SERVER"]
