"""deepagents' standard sandbox suite (``langchain-tests``' ``SandboxIntegrationTests``)
against :class:`PodbaySandbox` over a real ``podbay serve`` and one real sandbox.

The same suite against deepagents' own local backend is in
``test_deepagents_reference.py``; docs/integrations.md has both counts."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from deepagents import create_deep_agent
from deepagents.backends.protocol import SandboxBackendProtocol
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, ToolMessage
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


class ScriptedChatModel(GenericFakeChatModel):
    """langchain-core's fake chat model, answering with scripted tool calls (no network)."""

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self


def test_a_deep_agent_uses_the_sandbox(client: SandboxClient) -> None:
    name = f"deepagents-{uuid.uuid4().hex[:8]}"
    model = ScriptedChatModel(
        messages=iter(
            [
                AIMessage("", tool_calls=[{"name": "execute", "id": "c1",
                          "args": {"command": "cat /etc/hostname > /workspace/h.txt"}}]),
                AIMessage("", tool_calls=[{"name": "read_file", "id": "c2",
                          "args": {"file_path": "/workspace/h.txt"}}]),
                AIMessage("done"),
            ]
        )
    )  # fmt: skip
    backend = PodbaySandbox(name, client=client)
    try:
        agent = create_deep_agent(model=model, backend=backend)
        out = agent.invoke({"messages": [{"role": "user", "content": "note the hostname"}]})
        tools = [m.content for m in out["messages"] if isinstance(m, ToolMessage)]
        hostname = client.read_file(name, "/etc/hostname").strip()
        # The command ran in the podbay sandbox, and the agent read its file back.
        assert client.read_file(name, "/workspace/h.txt").strip() == hostname
        assert "exit code 0" in str(tools[0]), tools
        assert hostname in str(tools[1]), tools
        assert out["messages"][-1].content == "done"
    finally:
        backend.delete_sandbox()
