"""PodbayExecutor through smolagents' own executor interface (send_tools,
send_variables, __call__, final_answer) and a CodeAgent run, over a real sandbox."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from smolagents import CodeAgent
from smolagents.default_tools import FinalAnswerTool
from smolagents.models import ChatMessage, MessageRole, Model
from smolagents.utils import AgentError

from podbay.client import SandboxClient
from podbay.integrations.smolagents import PodbayExecutor
from podbay.testing.fixtures import shared_layer_dir
from podbay.testing.platform import PYDATA_SECTION, PlatformServer

pytestmark = pytest.mark.root

# smolagents' remote side (its variable deserializer, its tools' requirements)
# imports numpy and PIL, as its E2B and Docker images provide: declared once,
# the layer run_code's tests use too, built once per machine.
SPEC = "name: smolagents-tests\n" + PYDATA_SECTION


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SandboxClient]:
    with PlatformServer.start(
        tmp_path_factory.mktemp("serve-smolagents"),
        env={"PODBAY_RUNTIME_LAYER_DIR": shared_layer_dir()},
    ) as server:
        token = server.create_deployment("smolagents-tests", SPEC)
        with SandboxClient(
            identity_token=token, server_url=server.base_url, prepare_timeout_seconds=900
        ) as c:
            yield c


@pytest.fixture
def executor(client: SandboxClient) -> Iterator[PodbayExecutor]:
    ex = PodbayExecutor(["json"], sandbox=f"smol-{uuid.uuid4().hex[:8]}", client=client)
    yield ex
    ex.delete()


def test_the_executor_interface(executor: PodbayExecutor) -> None:
    executor.send_tools({"final_answer": FinalAnswerTool()})
    executor.send_variables({"x": 3, "names": ["a", "b"]})
    step = executor("import socket\ny = x * 2\nprint('host', socket.gethostname())\ny")
    assert step.output == "6"
    assert not step.is_final_answer
    assert step.logs.startswith("host ")
    # State persists between steps, as the agent's code relies on.
    assert executor("names + [str(y)]").output == "['a', 'b', '6']"
    final = executor("final_answer({'answer': y + 1})")
    assert final.is_final_answer
    assert final.output == {"answer": 7}
    with pytest.raises(AgentError, match="ZeroDivisionError"):
        executor("1 / 0")


class ScriptedModel(Model):
    """Answers each step with the next scripted message (no network, no key)."""

    def __init__(self, replies: list[str]) -> None:
        super().__init__(model_id="scripted")
        self.replies = list(replies)

    def generate(self, messages: Any, stop_sequences: Any = None, **kwargs: Any) -> ChatMessage:
        return ChatMessage(role=MessageRole.ASSISTANT, content=self.replies.pop(0))


def test_a_code_agent_runs_its_steps_in_the_sandbox(executor: PodbayExecutor) -> None:
    model = ScriptedModel(
        [
            "Thought: compute in the sandbox.\n<code>\nimport os\nv = len(os.uname().nodename)\n"
            "print(v > 0)\n</code>",
            "Thought: done.\n<code>\nfinal_answer(v * 0 + 42)\n</code>",
        ]
    )
    agent = CodeAgent(tools=[], model=model, executor=executor, max_steps=4)
    assert agent.run("What is the answer?") == 42
    assert executor("v > 0").output == "True"  # the agent's variable lives in the sandbox
