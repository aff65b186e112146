"""podbay.testing's cleanup: every class of a data directory is cleaned even
when another class's cleanup fails, and the failure is not swallowed."""

from __future__ import annotations

from pathlib import Path

import pytest

from podbay.runtime.classes import CONTAINER, GVISOR
from podbay.settings import Settings
from podbay.testing import fixtures


class FakeSession:
    closed: list[str] = []
    failing: str | None = None

    def __init__(self, settings: Settings) -> None:
        self.name = settings.data_dir.name

    def close(self) -> None:
        FakeSession.closed.append(self.name)
        if self.name == FakeSession.failing:
            raise RuntimeError(f"{self.name} would not go")


@pytest.fixture
def sessions(monkeypatch: pytest.MonkeyPatch) -> type[FakeSession]:
    FakeSession.closed = []
    monkeypatch.setattr(fixtures, "DriverSession", FakeSession)
    return FakeSession


def settings_with_gvisor(tmp_path: Path) -> Settings:
    settings = Settings.load(environ={}, data_dir=tmp_path / "node")
    (settings.data_dir / GVISOR).mkdir(parents=True)
    return settings


def test_a_failing_class_does_not_leave_the_next_one_running(
    tmp_path: Path, sessions: type[FakeSession]
) -> None:
    settings = settings_with_gvisor(tmp_path)
    sessions.failing = "node"  # the container class keeps the data dir itself
    with pytest.raises(ExceptionGroup) as raised:
        fixtures.cleanup(settings)
    assert sessions.closed == ["node", GVISOR]
    assert [str(e) for e in raised.value.exceptions] == ["node would not go"]


def test_every_class_is_cleaned(tmp_path: Path, sessions: type[FakeSession]) -> None:
    sessions.failing = None
    fixtures.cleanup(settings_with_gvisor(tmp_path))
    assert sessions.closed == ["node", GVISOR]
    assert CONTAINER not in sessions.closed
