"""What runc's state file says about a container, read without a subprocess: the
recorded init pid counts only while it is still that process (same start time)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from podbay.runtime.oci.runc import ContainerState, Runc


def start_time(pid: int) -> str:
    """Field 22 of /proc/<pid>/stat (after the command name, which may hold spaces)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2 :].split()[19]


def record(root: Path, container_id: str, pid: int, start: object) -> Path:
    directory = root / container_id
    directory.mkdir(parents=True)
    (directory / "state.json").write_text(
        json.dumps({"id": container_id, "init_process_pid": pid, "init_process_start": start})
    )
    return directory


@pytest.fixture
def child() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(["sleep", "60"])
    yield proc
    proc.kill()
    proc.wait()


def test_the_command_line_always_names_this_installations_state(tmp_path: Path) -> None:
    runc = Runc("runc", tmp_path / "state")
    assert runc.argv("pause", "m1") == ["runc", "--root", str(tmp_path / "state"), "pause", "m1"]
    assert runc.is_runc
    assert Runc("/usr/sbin/runc", tmp_path).is_runc
    assert not Runc("crun", tmp_path).is_runc
    assert not Runc("runsc", tmp_path).is_runc


def test_no_state_file_is_no_container(tmp_path: Path) -> None:
    assert Runc("runc", tmp_path).state("m1") is None


def test_an_unreadable_state_file_is_a_stopped_container(tmp_path: Path) -> None:
    (tmp_path / "m1").mkdir()
    (tmp_path / "m1/state.json").write_text("{not json")
    assert Runc("runc", tmp_path).state("m1") == ContainerState("stopped", 0)


def test_a_live_init_is_running(tmp_path: Path, child: subprocess.Popen[bytes]) -> None:
    record(tmp_path, "m1", child.pid, int(start_time(child.pid)))
    assert Runc("runc", tmp_path).state("m1") == ContainerState("running", child.pid)


def test_an_init_waiting_to_exec_is_created(tmp_path: Path, child: subprocess.Popen[bytes]) -> None:
    directory = record(tmp_path, "m1", child.pid, start_time(child.pid))
    (directory / "exec.fifo").write_text("")
    assert Runc("runc", tmp_path).state("m1") == ContainerState("created", child.pid)


def test_a_reused_pid_is_not_the_container(tmp_path: Path, child: subprocess.Popen[bytes]) -> None:
    record(tmp_path, "m1", child.pid, int(start_time(child.pid)) + 1)
    assert Runc("runc", tmp_path).state("m1") == ContainerState("stopped", child.pid)


def test_a_dead_or_missing_init_is_stopped(tmp_path: Path) -> None:
    zombie = subprocess.Popen(["true"])
    deadline = time.monotonic() + 30
    while Path(f"/proc/{zombie.pid}/stat").read_text().split(") ")[1][0] != "Z":
        assert time.monotonic() < deadline, "the child never exited"
        time.sleep(0.01)
    try:
        record(tmp_path, "zombie", zombie.pid, start_time(zombie.pid))
        assert Runc("runc", tmp_path).state("zombie") == ContainerState("stopped", zombie.pid)
    finally:
        zombie.wait()
    record(tmp_path, "reaped", zombie.pid, None)
    assert Runc("runc", tmp_path).state("reaped") == ContainerState("stopped", zombie.pid)
    record(tmp_path, "never", 0, None)
    assert Runc("runc", tmp_path).state("never") == ContainerState("stopped", 0)


def test_a_runtime_that_records_no_start_time_is_trusted_on_the_pid(tmp_path: Path) -> None:
    record(tmp_path, "m1", os.getpid(), None)
    assert Runc("runc", tmp_path).state("m1") == ContainerState("running", os.getpid())


def test_container_ids_are_the_state_directories(tmp_path: Path) -> None:
    assert Runc("runc", tmp_path / "missing").container_ids() == []
    for name in ("b", "a"):
        (tmp_path / name).mkdir()
    (tmp_path / "stray-file").write_text("")
    assert Runc("runc", tmp_path).container_ids() == ["a", "b"]
