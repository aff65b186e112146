"""``POST /v1/exec`` against a real agent."""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from agent_harness import AGENT_SECRET, DECLARED, Agent, gone

MIB = 1024 * 1024


def test_runs_argv_and_reports_output_code_and_time(agent: Agent) -> None:
    resp = agent.exec(["sh", "-c", "echo out; echo err >&2; pwd; exit 3"])
    assert resp.status_code == 200
    body = resp.json()
    assert body["exit_code"] == 3
    assert body["stdout"] == f"out\n{agent.workspace}\n"
    assert body["stderr"] == "err\n"
    assert body["timed_out"] is False
    assert body["truncated"] is False
    assert 0 <= body["duration_ms"] < 5000


def test_argv_is_not_a_shell_line(agent: Agent) -> None:
    body = agent.exec(["echo", "$HOME; rm -rf /", "*"]).json()
    assert body["stdout"] == "$HOME; rm -rf / *\n"


def test_cwd_relative_to_workspace_and_absolute(agent: Agent, workspace: Path) -> None:
    assert agent.exec(["pwd"], cwd=workspace.name).json()["stdout"] == f"{workspace}\n"
    assert agent.exec(["pwd"], cwd="/").json()["stdout"] == "/\n"


def test_three_mib_of_output_keeps_exactly_one_mib(agent: Agent) -> None:
    script = "import sys; sys.stdout.write('x' * 3 * 2**20); sys.stderr.write('e' * 5); sys.exit(7)"
    resp = agent.exec(["python3", "-c", script])
    body = resp.json()  # valid JSON however large the output was
    assert body["exit_code"] == 7
    assert len(body["stdout"]) == MIB
    assert set(body["stdout"]) == {"x"}
    assert body["stderr"] == "eeeee"
    assert body["truncated"] is True
    assert body["timed_out"] is False


def test_cap_never_ends_in_half_a_character(agent: Agent) -> None:
    # 'x' then 2-byte characters: the 1 MiB cut falls inside one.
    script = "import sys; sys.stdout.write('x' + '\u00e9' * 2**20)"
    body = agent.exec(["python3", "-c", script]).json()
    assert body["truncated"] is True
    assert body["stdout"].endswith("\u00e9")
    assert "\ufffd" not in body["stdout"]
    assert len(body["stdout"].encode()) == MIB - 1


def test_undecodable_bytes_are_replaced_not_dropped(agent: Agent) -> None:
    body = agent.exec(["printf", "a\\377b"]).json()
    assert body["stdout"] == "a\ufffdb"


def test_deadline_kills_the_whole_group_and_answers_at_once(agent: Agent) -> None:
    script = "sleep 60 & echo $!; echo $$; sleep 60"
    started = time.monotonic()
    body = agent.exec(["sh", "-c", script], timeout_ms=700).json()
    elapsed = time.monotonic() - started
    assert body["timed_out"] is True
    assert body["exit_code"] == 128 + 9
    assert 0.7 <= elapsed < 30, elapsed  # at its deadline, not after sleep 60
    grandchild, shell = (int(line) for line in body["stdout"].split())
    assert gone(shell)
    assert gone(grandchild)


def test_background_grandchild_holding_pipes_does_not_delay_the_answer(agent: Agent) -> None:
    started = time.monotonic()
    body = agent.exec(["sh", "-c", "sleep 30 & echo $!; echo started"], timeout_ms=20_000).json()
    elapsed = time.monotonic() - started
    pid = int(body["stdout"].split()[0])
    try:
        assert body["exit_code"] == 0
        assert body["timed_out"] is False
        assert body["stdout"].endswith("started\n")
        assert elapsed < 15, elapsed  # not held until the 20 s timeout or sleep 30
        os.kill(pid, 0)  # left running
    finally:
        os.kill(pid, 9)
    assert gone(pid)


def test_killed_by_signal_reports_128_plus_n(agent: Agent) -> None:
    assert agent.exec(["sh", "-c", "kill -TERM $$"]).json()["exit_code"] == 143
    assert agent.exec(["sh", "-c", "kill -USR1 $$"]).json()["exit_code"] == 138


@pytest.mark.parametrize(
    ("command", "cwd", "reason"),
    [
        (["/no/such/program"], None, "No such file or directory"),
        (["no-such-program-on-path"], None, "No such file or directory"),
        (["./not-executable"], None, "Permission denied"),
        (["echo", "x" * 200_000], None, "Argument list too long"),
        (["true"], "/no/such/dir", "No such file or directory"),
        (["true"], "a-file", "Not a directory"),
    ],
)
def test_command_that_cannot_start_is_refused(
    agent: Agent, workspace: Path, command: list[str], cwd: str | None, reason: str
) -> None:
    (workspace / "not-executable").write_text("#!/bin/sh\necho ran\n")
    (workspace / "a-file").write_text("")
    real_cwd = cwd if cwd is None or cwd.startswith("/") else f"{workspace}/{cwd}"
    resp = agent.exec(command, cwd=real_cwd or str(workspace))
    assert resp.status_code == 400
    body = resp.json()
    assert body["code"] == "COMMAND_START_FAILED"
    assert reason in body["error"]
    if cwd is not None:
        assert "cwd" in body["error"]


@pytest.mark.parametrize(
    "payload",
    [
        {"command": []},
        {"command": [""]},
        {"command": "echo hi"},
        {"command": ["echo"], "shell": True},
        {"command": ["echo"], "timeout_ms": 0},
        {"command": ["echo"], "env": {"A=B": "x"}},
        {"command": ["echo", "nul\u0000byte"]},
        {},
    ],
)
def test_malformed_requests_are_refused(agent: Agent, payload: dict[str, object]) -> None:
    resp = agent.client.post("/v1/exec", json=payload)
    assert resp.status_code == 400
    assert resp.json()["code"] == "REQUEST_INVALID"


def test_body_that_is_not_json_is_refused(agent: Agent) -> None:
    resp = agent.client.post("/v1/exec", content=b"{not json")
    assert resp.status_code == 400
    assert resp.json()["code"] == "REQUEST_INVALID"


def test_environment_is_clean_base_then_env_file_then_request(agent: Agent) -> None:
    body = agent.exec(["env"], env={"EXTRA": "1", "HOME": "/elsewhere"}).json()
    env = dict(line.split("=", 1) for line in body["stdout"].splitlines())
    env.pop("PWD", None)  # sh-less, but some envs add it
    assert AGENT_SECRET not in env
    assert env == {
        "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": "/elsewhere",
        "LANG": "C.UTF-8",
        "TERM": "xterm",
        "EXTRA": "1",
        **DECLARED,
    }


def test_fifty_concurrent_execs(agent: Agent) -> None:
    # A barrier, not a stopwatch: each command waits until all fifty have
    # started, so the run only completes if they ran side by side.
    barrier = f"/tmp/podbay-barrier-{os.getpid()}-{time.monotonic_ns()}"
    script = (
        f"mkdir -p {barrier}; touch {barrier}/$0; "
        f"while [ $(ls {barrier} | wc -l) -lt 50 ]; do sleep 0.05; done; echo $0"
    )

    def one(i: int) -> tuple[int, dict[str, object]]:
        with agent.new_client() as client:
            resp = client.post(
                "/v1/exec",
                json={"command": ["sh", "-c", script, str(i)], "timeout_ms": 120_000},
                timeout=180,
            )
            return i, resp.json()

    with ThreadPoolExecutor(50) as pool:
        results = list(pool.map(one, range(50)))
    agent.exec(["rm", "-rf", barrier])
    for i, body in results:
        assert body["timed_out"] is False
        assert body["exit_code"] == 0
        assert body["stdout"] == f"{i}\n"
