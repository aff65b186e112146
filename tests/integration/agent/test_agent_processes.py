"""``/v1/processes`` against a real agent."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

from agent_harness import Agent, gone

MIB = 1024 * 1024


def _poll(agent: Agent, pid: str, stdout_from: int = 0, stderr_from: int = 0) -> dict[str, Any]:
    resp = agent.client.get(
        f"/v1/processes/{pid}", params={"stdout_from": stdout_from, "stderr_from": stderr_from}
    )
    assert resp.status_code == 200, resp.text
    return dict(resp.json())


def test_spawn_poll_and_exit(agent: Agent) -> None:
    resp = agent.spawn(["sh", "-c", "echo a; echo b >&2; exit 4"])
    assert resp.status_code == 200
    status = resp.json()
    assert status["state"] in ("running", "exited")
    assert status["command"] == ["sh", "-c", "echo a; echo b >&2; exit 4"]
    pid = status["process_id"]
    agent.wait_exited(pid)
    out = _poll(agent, pid)
    assert out["state"] == "exited"
    assert out["exit_code"] == 4
    assert (out["stdout"], out["stderr"]) == ("a\n", "b\n")
    assert (out["stdout_next"], out["stderr_next"]) == (2, 2)
    assert out["exited_at"] >= out["started_at"]
    again = _poll(agent, pid, out["stdout_next"], out["stderr_next"])
    assert (again["stdout"], again["stderr"], again["stdout_dropped"]) == ("", "", 0)
    # An exited process is kept, with its code, until it is forgotten.
    listed = {p["process_id"]: p for p in agent.client.get("/v1/processes").json()["processes"]}
    assert listed[pid]["exit_code"] == 4
    assert agent.client.delete(f"/v1/processes/{pid}").status_code == 204
    assert agent.client.get(f"/v1/processes/{pid}").json()["code"] == "PROCESS_NOT_FOUND"


def test_five_mib_polled_after_exit_drops_exactly_four(agent: Agent) -> None:
    # 524288 lines of 10 bytes: line i starts at byte 10*i.
    script = "import sys; w = sys.stdout.buffer.write\nfor i in range(524288): w(b'%09d\\n' % i)"
    pid = agent.spawn(["python3", "-c", script]).json()["process_id"]
    agent.wait_exited(pid)
    out = _poll(agent, pid)
    assert out["stdout_dropped"] == 4 * MIB
    assert out["stdout_next"] == 5 * MIB
    assert len(out["stdout"]) == MIB
    expected = b"".join(b"%09d\n" % i for i in range(524288))[4 * MIB :]
    assert out["stdout"].encode() == expected
    again = _poll(agent, pid, out["stdout_next"])
    assert (again["stdout"], again["stdout_next"], again["stdout_dropped"]) == ("", 5 * MIB, 0)
    # Asking from the middle of the lost part: dropped counts from there.
    mid = _poll(agent, pid, 3 * MIB)
    assert mid["stdout_dropped"] == MIB
    assert mid["stdout"].encode() == expected
    agent.client.delete(f"/v1/processes/{pid}")


def test_four_byte_character_straddling_a_poll_is_never_split(
    agent: Agent, workspace: Path
) -> None:
    script = (
        "import os, sys, time\n"
        "o = sys.stdout.buffer\n"
        "o.write(b'a\\xf0\\x9f'); o.flush()\n"
        "while not os.path.exists('go'): time.sleep(0.01)\n"
        "o.write(b'\\x98\\x80!'); o.flush()\n"
    )
    pid = agent.spawn(["python3", "-c", script], cwd=str(workspace)).json()["process_id"]
    deadline = time.monotonic() + 5
    out = _poll(agent, pid)
    while out["stdout_next"] == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
        out = _poll(agent, pid)
    time.sleep(0.1)  # the half character is surely in the agent by now
    out = _poll(agent, pid)
    assert (out["stdout"], out["stdout_next"], out["state"]) == ("a", 1, "running")
    (workspace / "go").touch()
    agent.wait_exited(pid)
    rest = _poll(agent, pid, out["stdout_next"])
    assert (rest["stdout"], rest["stdout_next"]) == ("\U0001f600!", 6)
    agent.client.delete(f"/v1/processes/{pid}")


def test_sixty_fifth_process_is_refused(fresh_agent: Agent) -> None:
    ids = []
    for _ in range(64):
        resp = fresh_agent.spawn(["sleep", "30"])
        assert resp.status_code == 200
        ids.append(resp.json()["process_id"])
    resp = fresh_agent.spawn(["sleep", "30"])
    assert resp.status_code == 429
    assert resp.json()["code"] == "PROCESS_LIMIT_REACHED"
    assert len(fresh_agent.client.get("/v1/processes").json()["processes"]) == 64
    assert fresh_agent.client.delete(f"/v1/processes/{ids[0]}").status_code == 204
    assert fresh_agent.spawn(["sleep", "30"]).status_code == 200


def test_each_signal_name_reaches_the_process(agent: Agent) -> None:
    names = ["TERM", "KILL", "INT", "HUP", "QUIT", "USR1", "USR2"]
    ids = {name: agent.spawn(["sleep", "30"]).json()["process_id"] for name in names}
    for name, pid in ids.items():
        resp = agent.client.post(f"/v1/processes/{pid}/signal", json={"signal": name})
        assert resp.status_code == 204
    for name, pid in ids.items():
        status = agent.wait_exited(pid)
        assert status["exit_code"] == 128 + getattr(signal, f"SIG{name}"), name
        agent.client.delete(f"/v1/processes/{pid}")


def test_unknown_signal_is_refused(agent: Agent) -> None:
    pid = agent.spawn(["sleep", "30"]).json()["process_id"]
    for bad in ("BOGUS", "SIGTERM", "term", "9", ""):
        resp = agent.client.post(f"/v1/processes/{pid}/signal", json={"signal": bad})
        assert resp.status_code == 400, bad
        assert resp.json()["code"] == "SIGNAL_INVALID", bad
    assert _poll(agent, pid)["state"] == "running"
    agent.client.delete(f"/v1/processes/{pid}")


def test_signal_defaults_to_term_and_reaches_the_group(agent: Agent) -> None:
    pid = agent.spawn(["sh", "-c", "sleep 30 & echo $!; wait"]).json()["process_id"]
    out = _poll(agent, pid)
    while not out["stdout"]:
        time.sleep(0.01)
        out = _poll(agent, pid)
    grandchild = int(out["stdout"])
    assert agent.client.post(f"/v1/processes/{pid}/signal", content=b"").status_code == 204
    assert agent.wait_exited(pid)["exit_code"] == 143
    assert gone(grandchild)
    agent.client.delete(f"/v1/processes/{pid}")


def test_delete_kills_a_running_process_and_forgets_it(agent: Agent) -> None:
    pid = agent.spawn(["sh", "-c", "echo $$; exec sleep 30"]).json()["process_id"]
    out = _poll(agent, pid)
    while not out["stdout"]:
        time.sleep(0.01)
        out = _poll(agent, pid)
    os_pid = int(out["stdout"])
    assert agent.client.delete(f"/v1/processes/{pid}").status_code == 204
    assert gone(os_pid)
    ids = [p["process_id"] for p in agent.client.get("/v1/processes").json()["processes"]]
    assert pid not in ids


def test_unknown_process_is_not_found(agent: Agent) -> None:
    for resp in (
        agent.client.get("/v1/processes/nope"),
        agent.client.delete("/v1/processes/nope"),
        agent.client.post("/v1/processes/nope/signal", json={"signal": "TERM"}),
    ):
        assert resp.status_code == 404
        assert resp.json()["code"] == "PROCESS_NOT_FOUND"


def test_spawn_that_cannot_start_is_refused_and_takes_no_slot(agent: Agent) -> None:
    before = len(agent.client.get("/v1/processes").json()["processes"])
    resp = agent.spawn(["/no/such/program"])
    assert resp.status_code == 400
    assert resp.json()["code"] == "COMMAND_START_FAILED"
    assert len(agent.client.get("/v1/processes").json()["processes"]) == before


def test_bad_offsets_are_refused(agent: Agent) -> None:
    pid = agent.spawn(["true"]).json()["process_id"]
    resp = agent.client.get(f"/v1/processes/{pid}", params={"stdout_from": "-1"})
    assert resp.status_code == 400
    assert resp.json()["code"] == "REQUEST_INVALID"
    agent.client.delete(f"/v1/processes/{pid}")


def test_a_process_that_is_never_read_never_blocks(agent: Agent) -> None:
    # 20 MiB into a pipe nobody polls: the pump drains it, so the writer finishes.
    pid = agent.spawn(["sh", "-c", "head -c 20971520 /dev/zero"]).json()["process_id"]
    status = agent.wait_exited(pid, timeout=20)
    assert status["exit_code"] == 0
    out = _poll(agent, pid)
    assert out["stdout_dropped"] == 20 * MIB - MIB
    assert out["stdout_next"] == 20 * MIB
    agent.client.delete(f"/v1/processes/{pid}")


def test_kill_takes_the_tree_and_kill_all_takes_every_descendant(
    fresh_agent: Agent, tmp_path: Path
) -> None:
    # Outside a sandbox (not PID 1): the agent's own descendants only, never kill(-1).
    pids = tmp_path / "pids"
    escaped = (
        f"setsid sh -c 'echo $$ >> {pids}; exec sleep 300' </dev/null >/dev/null 2>&1 & "
        f"echo $$ >> {pids}; sleep 300"
    )
    pid = fresh_agent.spawn(["sh", "-c", escaped]).json()["process_id"]
    deadline = time.monotonic() + 10
    while len(pids.read_text().split() if pids.exists() else []) < 2:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    tree = [int(p) for p in pids.read_text().split()]
    assert fresh_agent.client.delete(f"/v1/processes/{pid}").status_code == 204
    assert all(gone(p, 5) for p in tree), "the setsid child outlived its command's kill"
    pids.unlink()
    # An orphan in a session of its own (lineage to a tracked command lost) and a
    # tracked process: DELETE /v1/processes takes both, the agent lives on.
    fresh_agent.spawn(
        [
            "sh",
            "-c",
            f"setsid sh -c 'echo $$ >> {pids}; exec sleep 300' </dev/null >/dev/null 2>&1 &",
        ]
    )
    tracked = fresh_agent.spawn(["sleep", "300"]).json()["process_id"]
    deadline = time.monotonic() + 10
    while not pids.exists() or not pids.read_text().strip():
        assert time.monotonic() < deadline
        time.sleep(0.02)
    orphan = int(pids.read_text().split()[0])
    assert fresh_agent.client.delete("/v1/processes").status_code == 204
    assert gone(orphan, 5)
    fresh_agent.wait_exited(tracked)
    assert _poll(fresh_agent, tracked)["exit_code"] == 137
    assert fresh_agent.client.get("/v1/info").status_code == 200
