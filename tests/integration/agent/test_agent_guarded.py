"""A guarded agent (as under gVisor, here on the host's kernel as the init of
a PID namespace) starts every command through its launcher: one process in
one user namespace without the agent's id (podbay.agent.launcher). Each
command still gets all an exec or a spawn promises, the launcher can be
killed without taking commands with it, and sandbox code still cannot reach
the agent."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from agent_harness import GUARD_ARGS, GUARDED, Agent, launcher_program, open_pty, start_agent

from podbay.runtime import probes
from podbay.wire.paths import EXEC_STDIN_CONTENT_TYPE

pytestmark = pytest.mark.root

#: Prints the command's user namespace, id map, ids, parent and OOM score.
WHO = (
    "readlink /proc/self/ns/user; cat /proc/self/uid_map; id -u; id -G; "
    "echo $PPID; cat /proc/self/oom_score_adj"
)


@pytest.fixture(scope="module", params=["program", "python"])
def guarded(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, staged: Path
) -> Iterator[Agent]:
    """Its launcher as the program the runtime builds (launcher.c), and as the
    agent's own Python (where the host has no C compiler)."""
    args = GUARD_ARGS
    if request.param == "program":
        program = launcher_program(tmp_path_factory.mktemp("launcher"))
        args = (*GUARD_ARGS, "--launcher", str(program))
    running = start_agent(tmp_path_factory.mktemp("guarded"), staged, GUARDED, args=args)
    yield running
    running.stop()


def _exec(agent: Agent, command: list[str], **fields: object) -> dict[str, object]:
    resp = agent.exec(command, **fields)
    assert resp.status_code == 200, resp.text
    return dict(resp.json())


def _stdout(agent: Agent, script: str) -> list[str]:
    body = _exec(agent, ["sh", "-c", script])
    assert body["exit_code"] == 0, body
    return str(body["stdout"]).split("\n")


def test_commands_share_one_namespace_without_the_agents_id(guarded: Agent) -> None:
    first = _stdout(guarded, WHO)
    second = _stdout(guarded, WHO)
    # One namespace for all, made once: the same inode for both commands.
    assert first[0] == second[0]
    assert first[1].split() == ["0", "0", "65535"]  # ids 0..65534; the agent's 65535 left out
    assert first[2:4] == ["0", "0"]  # root there, groups [0]
    launcher = int(first[4])
    assert launcher > 1
    assert launcher == int(second[4])
    assert first[5] == "1000"  # the commands' OOM score, inherited from the launcher
    # A `pkill python` (SIGTERM) in the sandbox leaves the launcher serving,
    # and its commands start with the signals it catches at their default.
    survived = _exec(
        guarded, ["sh", "-c", "kill -TERM $PPID; cat /proc/self/status | grep -E 'SigCgt|SigIgn'"]
    )
    assert survived["stdout"] == "SigIgn:\t0000000000000000\nSigCgt:\t0000000000000000\n", survived
    assert int(_stdout(guarded, WHO)[4]) == launcher
    # Nothing of the launcher's (nor the agent's) is open in a command: ls
    # sees its three streams and the directory it lists.
    assert _exec(guarded, ["ls", "/proc/self/fd"])["stdout"] == "0\n1\n2\n3\n"


def test_the_launcher_is_the_program_when_given_one(
    guarded: Agent, request: pytest.FixtureRequest
) -> None:
    # Its name: a launcher that fell back to Python would pass every other test.
    name = _stdout(guarded, "cat /proc/$PPID/comm")[0]
    assert (name == "launcher") == (request.node.callspec.params["guarded"] == "program"), name


def test_each_command_gets_what_an_exec_promises(guarded: Agent, tmp_path: Path) -> None:
    assert _exec(guarded, ["sh", "-c", "exit 3"])["exit_code"] == 3
    assert _exec(guarded, ["sh", "-c", "kill -9 $$"])["exit_code"] == 137
    request = {
        "command": ["sh", "-c", 'pwd; echo "$PODBAY_DECLARED $MINE"; cat'],
        "cwd": "/tmp",
        "env": {"MINE": "mine"},
    }
    fed = guarded.client.post(
        "/v1/exec",
        headers={"Content-Type": EXEC_STDIN_CONTENT_TYPE},
        content=json.dumps(request).encode() + b"\nfed\n",
    )
    assert fed.json()["stdout"] == "/tmp\nfrom-env-file mine\nfed\n", fed.text
    nobody = _exec(guarded, ["sh", "-c", "id -u; id -g; echo $HOME $USER"], user="nobody")
    assert str(nobody["stdout"]).split()[:2] == ["65534", "65534"], nobody
    assert str(nobody["stdout"]).split()[3] == "nobody", nobody
    started = time.monotonic()
    late = _exec(guarded, ["sh", "-c", "sleep 30 & sleep 30"], timeout_ms=500)
    assert late["timed_out"] is True, late
    assert time.monotonic() - started < 20, late
    # Refusals name what was missing, as without the guard.
    missing = guarded.exec(["/no/such/program"])
    assert missing.status_code == 400, missing.text
    assert missing.json()["code"] == "COMMAND_START_FAILED"
    assert "cannot start '/no/such/program'" in missing.json()["error"]
    no_cwd = guarded.exec(["true"], cwd=str(tmp_path / "absent"))
    assert "cannot use cwd" in no_cwd.json()["error"], no_cwd.text


def test_spawned_process_reports_its_pid_and_takes_signals_as_a_group(guarded: Agent) -> None:
    resp = guarded.spawn(["sh", "-c", "echo $$; sleep 60 & echo $!; wait"])
    assert resp.status_code == 200, resp.text
    process_id = resp.json()["process_id"]
    out = ""
    deadline = time.monotonic() + 10
    while out.count("\n") < 2 and time.monotonic() < deadline:
        out = guarded.client.get(f"/v1/processes/{process_id}").json()["stdout"]
    shell, background = (int(pid) for pid in out.split())
    assert shell in _pids_in(guarded)
    sent = guarded.client.post(f"/v1/processes/{process_id}/signal", json={"signal": "TERM"})
    assert sent.status_code == 204, sent.text
    assert guarded.wait_exited(process_id)["exit_code"] == 128 + 15
    assert background not in _pids_in(guarded)  # the group got it: the background job too
    guarded.forget_all()


def test_a_killed_launcher_is_replaced_and_its_commands_still_report(guarded: Agent) -> None:
    resp = guarded.spawn(["sh", "-c", "read line; exit 4"], stdin=True)
    assert resp.status_code == 200, resp.text
    process_id = resp.json()["process_id"]
    launcher = int(_stdout(guarded, WHO)[4])
    # Root in the commands' namespace may kill the launcher (it holds nothing).
    # Not at once: killed before it answered, it would fail its own start.
    # It outlives the launcher: then the agent, its new parent, reaps it.
    killer = guarded.spawn(["sh", "-c", f"sleep 1; kill -9 {launcher}; sleep 0.5; exit 9"])
    assert guarded.wait_exited(killer.json()["process_id"])["exit_code"] == 9
    replaced = int(_stdout(guarded, WHO)[4])
    assert replaced != launcher
    assert launcher not in _pids_in(guarded)
    # The spawned command outlived its launcher and still takes stdin and reports.
    wrote = guarded.client.post(
        f"/v1/processes/{process_id}/stdin", params={"close": "true"}, content=b"go\n"
    )
    assert wrote.status_code == 204, wrote.text
    assert guarded.wait_exited(process_id)["exit_code"] == 4
    guarded.forget_all()


def test_a_terminal_through_the_launcher(guarded: Agent) -> None:
    sock, head, frames = open_pty(
        guarded, command=["sh", "-c", "tty; id -u; exit 5"], rows=24, cols=80, term="xterm"
    )
    assert head.startswith(b"HTTP/1.1 101"), head
    assert b"/dev/pts/" in frames.output_until(b"\n")
    assert frames.exit_code() == 5
    sock.close()


def test_sandbox_code_still_cannot_reach_the_agent(guarded: Agent) -> None:
    body = _exec(guarded, ["python3", "-c", probes.AGENT_ATTACKS], timeout_ms=30_000)
    outcomes = json.loads(str(body["stdout"]))
    # The agent changed ids, so the host's kernel hands its /proc files to root
    # of the namespace its memory was made in (the commands' root, here): its
    # OOM score is writable, as under gVisor (probes.OWN_KERNEL_HARMLESS).
    won = {k: v for k, v in outcomes.items() if not v.startswith("refused")}
    # This agent runs on the host's own files, not a sandbox's root filesystem
    # with its /etc/ld.so.preload bound read-only: that attack is the runtime's.
    assert set(won) <= {"oom_score_adj", "preload"}, outcomes
    # Nor through the launcher: it is not dumpable (it changed ids), so it
    # cannot be traced or have its memory read by root of its namespace.
    launcher = int(_stdout(guarded, WHO)[4])
    trace = (
        "import ctypes, sys; libc = ctypes.CDLL(None, use_errno=True); "
        f"print(libc.ptrace(0x4206, {launcher}, 0, 0), ctypes.get_errno())"
    )
    assert _exec(guarded, ["python3", "-c", trace])["stdout"] == "-1 1\n"  # EPERM
    mem = _exec(guarded, ["sh", "-c", f"cat /proc/{launcher}/mem"])
    assert "Permission denied" in str(mem["stderr"]), mem


def _pids_in(agent: Agent) -> set[int]:
    """Every live process of the agent's namespace, seen from inside."""
    script = (
        "for s in /proc/[0-9]*/stat; do read -r pid _ state _ < $s 2>/dev/null && "
        '[ "$state" != Z ] && echo $pid; done'
    )
    return {int(pid) for pid in _stdout(agent, script) if pid}


def test_file_calls_as_a_user(guarded: Agent) -> None:
    """gVisor has no setfsuid: a guarded agent acts as the user on the calling
    thread's effective ids instead (here on the host's kernel: the same calls)."""
    with tempfile.TemporaryDirectory(prefix="podbay-guarded-") as where:
        os.chmod(where, 0o755)  # pytest's directories are root's alone: nobody cannot pass
        _file_calls_as_nobody(guarded, Path(where))


def _file_calls_as_nobody(guarded: Agent, base: Path) -> None:
    (base / "theirs").mkdir()
    os.chown(base / "theirs", 65534, 65534)
    (base / "secret").write_bytes(b"root only")
    os.chmod(base / "secret", 0o600)
    as_nobody = {"user": "nobody"}
    data = b"written as nobody"
    put = guarded.client.put(
        "/v1/files",
        params={"path": f"{base}/theirs/new", **as_nobody},
        content=data,
        headers={"X-Podbay-Sha256": hashlib.sha256(data).hexdigest()},
    )
    assert put.status_code == 200, put.text
    assert (os.stat(base / "theirs" / "new").st_uid, (base / "theirs" / "new").read_bytes()) == (
        65534,
        data,
    )
    made = guarded.client.post(
        "/v1/files/mkdir", params=as_nobody, json={"path": f"{base}/theirs/a/b"}
    )
    assert made.status_code == 200, made.text
    assert os.stat(base / "theirs" / "a").st_uid == 65534
    for denied in (
        guarded.client.get("/v1/files", params={"path": f"{base}/secret", **as_nobody}),
        guarded.client.post("/v1/files/mkdir", params=as_nobody, json={"path": f"{base}/x"}),
    ):
        assert (denied.status_code, denied.json()["code"]) == (409, "PATH_ACCESS_DENIED")
    # The thread took the agent's own ids back: root's calls are root's again.
    assert guarded.client.get("/v1/files", params={"path": f"{base}/secret"}).content == (
        b"root only"
    )
    root_put = guarded.client.put(
        "/v1/files",
        params={"path": f"{base}/mine"},
        content=b"x",
        headers={"X-Podbay-Sha256": hashlib.sha256(b"x").hexdigest()},
    )
    assert root_put.status_code == 200, root_put.text
    assert os.stat(base / "mine").st_uid == 0
