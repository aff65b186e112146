"""deepagents' standard sandbox suite (``langchain-tests``' ``SandboxIntegrationTests``)
against :class:`PodbaySandbox` over a real ``podbay serve`` and one real sandbox.

The same suite against deepagents' own local backend is in
``test_deepagents_reference.py``; docs/integrations.md has both counts."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from deepagents.backends.protocol import SandboxBackendProtocol
from langchain_tests.integration_tests import SandboxIntegrationTests

from podbay.client import SandboxClient
from podbay.integrations.deepagents import PodbaySandbox
from podbay.testing.platform import PlatformServer

# The suite's async tests carry no marker of their own (langchain runs them in
# pytest-asyncio's auto mode); anyio's marker applies to them only, for anyio (asyncio).
pytestmark = [pytest.mark.root, pytest.mark.anyio]


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SandboxClient]:
    with PlatformServer.start(tmp_path_factory.mktemp("serve-deepagents")) as server:
        token = server.create_deployment("deepagents-tests")
        with SandboxClient(
            identity_token=token, server_url=server.base_url, timeout_seconds=180
        ) as c:
            yield c


class TestPodbaySandboxStandard(SandboxIntegrationTests):
    @pytest.fixture(scope="class")
    @classmethod
    def sandbox(cls, client: SandboxClient) -> Iterator[SandboxBackendProtocol]:
        backend = PodbaySandbox(f"deepagents-{uuid.uuid4().hex[:8]}", client=client)
        try:
            yield backend
        finally:
            backend.delete_sandbox()
