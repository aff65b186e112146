"""The agent's OOM-kill counter: read in place, the file opened once."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from podbay.agent import oom


@pytest.fixture
def counter(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "memory.events"
    path.write_bytes(b"low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n")
    monkeypatch.setattr(oom, "COUNTERS", (str(tmp_path / "absent"), str(path)))
    monkeypatch.setattr(oom, "_counter_fd", None)
    monkeypatch.setattr(oom, "_counter_looked", False)
    return path


def test_the_counter_is_opened_once_and_read_again_in_place(
    counter: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """kills() runs twice per exec: one open for the agent's life, then a pread each."""
    opened: list[str] = []
    real_open = os.open

    def counting_open(path: str, *args: int) -> int:
        opened.append(path)
        return real_open(path, *args)

    monkeypatch.setattr(os, "open", counting_open)
    assert oom.kills() == 1
    counter.write_bytes(b"low 0\nhigh 0\nmax 3\noom 2\noom_kill 2\n")  # same file
    assert oom.kills() == 2
    assert oom.kills() == 2
    assert opened == [str(counter.with_name("absent")), str(counter)]
    assert not os.get_inheritable(oom._counter_fd or -1)  # not passed to commands


def test_no_counter_file_is_none_and_not_looked_for_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(oom, "COUNTERS", (str(tmp_path / "a"), str(tmp_path / "b")))
    monkeypatch.setattr(oom, "_counter_fd", None)
    monkeypatch.setattr(oom, "_counter_looked", False)
    assert oom.kills() is None
    (tmp_path / "a").write_bytes(b"oom_kill 5\n")
    assert oom.kills() is None  # the cgroup's files do not come and go
