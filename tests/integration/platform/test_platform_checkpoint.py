"""Checkpoint to disk through the platform: a ``gvisor`` sandbox with
``PODBAY_RUNTIME_CHECKPOINT_CLASSES=gvisor`` is checkpointed when stopped and
when idle, and attach restores it with its processes running on."""

from __future__ import annotations

import contextlib
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from podbay.testing.platform import PlatformServer

pytestmark = pytest.mark.root

COUNTER = "i=0; while :; do i=$((i+1)); echo $i > /tmp/n; sleep 0.2; done"


def _machine_of(server: PlatformServer, handle: dict[str, Any]) -> str:
    sandbox_id = handle["endpoint"].rsplit("/", 1)[1]
    with sqlite3.connect(server.data_dir / "podbay.db") as db:
        (machine_id,) = db.execute(
            "SELECT machine_id FROM sandboxes WHERE id=?", (sandbox_id,)
        ).fetchone()
    return str(machine_id)


def _state(server: PlatformServer, token: str, name: str) -> Any:
    r = server.api("GET", f"/api/v1/sandboxes/{name}", token)
    return r.json()["state"] if r.status_code == 200 else r.status_code


def _wait_state(server: PlatformServer, token: str, name: str, want: str) -> None:
    deadline = time.monotonic() + 60
    while (state := _state(server, token, name)) != want:
        assert time.monotonic() < deadline, f"{name} is {state}, wanted {want}"
        time.sleep(0.2)


def _count(server: PlatformServer, handle: dict[str, Any]) -> int:
    answer = server.exec(handle, "cat", "/tmp/n").json()
    return int(answer["stdout"])


def _host_processes_of(machine_id: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if machine_id.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
    return found


def _assert_checkpointed(server: PlatformServer, machine_id: str) -> None:
    home = server.data_dir / "gvisor" / "machines" / machine_id
    assert (home / "checkpoint.json").is_file()
    assert _host_processes_of(machine_id) == []


def test_a_gvisor_sandbox_checkpoints_when_stopped_and_idle_and_runs_on(make_server):
    server = make_server(
        {
            "PODBAY_RUNTIME_CLASSES": "gvisor",
            "PODBAY_RUNTIME_CHECKPOINT_CLASSES": "gvisor",
            "PODBAY_LIFECYCLE_IDLE_SECONDS": "3",
            "PODBAY_LIFECYCLE_INTERVAL_SECONDS": "0.25",
        }
    )
    token = server.create_deployment("keeps-running")
    handle = server.attach(token, "ck", json={"class": "gvisor"}).json()
    spawned = server.data(
        handle, "POST", "/v1/processes", json={"command": ["sh", "-c", COUNTER]}
    ).json()
    machine_id = _machine_of(server, handle)
    deadline = time.monotonic() + 30
    while server.exec(handle, "test", "-s", "/tmp/n").json()["exit_code"] != 0:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    before = _count(server, handle)

    # Explicitly (POST .../stop), then by the idle timer.
    for how in ("stop", "idle"):
        if how == "stop":
            r = server.api("POST", "/api/v1/sandboxes/ck/stop", token)
            assert r.status_code in (200, 202, 204), r.text
        _wait_state(server, token, "ck", "suspended")
        _assert_checkpointed(server, machine_id)
        resumed = server.attach(token, "ck").json()
        assert resumed["start"] == "resumed"
        polled = server.data(resumed, "GET", f"/v1/processes/{spawned['process_id']}").json()
        assert polled["state"] == "running"
        deadline = time.monotonic() + 30
        while (after := _count(server, resumed)) <= before:
            assert time.monotonic() < deadline, "the counter did not run on"
            time.sleep(0.1)
        before = after
