"""Fixtures: the agent under test (see ``agent_harness``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from agent_harness import UPGRADED, Agent, start_agent

from podbay.runtime.staging import stage


@pytest.fixture(scope="session")
def staged(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return stage(tmp_path_factory.mktemp("staged"))


@pytest.fixture(scope="session")
def agent(tmp_path_factory: pytest.TempPathFactory, staged: Path) -> Iterator[Agent]:
    """One agent shared by the session (tests clean up what they spawn)."""
    running = start_agent(tmp_path_factory.mktemp("agent"), staged)
    yield running
    running.stop()


@pytest.fixture
def fresh_agent(tmp_path: Path, staged: Path) -> Iterator[Agent]:
    """An agent of its own, for tests that fill tables or measure memory."""
    running = start_agent(tmp_path, staged)
    yield running
    running.stop()


@pytest.fixture
def workspace(agent: Agent, tmp_path: Path) -> Path:
    """A fresh directory inside the shared agent's workspace, as a relative base."""
    path = agent.workspace / tmp_path.name
    path.mkdir()
    return path


@pytest.fixture(autouse=True)
def close_upgraded() -> Iterator[None]:
    yield
    while UPGRADED:
        UPGRADED.pop().close()
