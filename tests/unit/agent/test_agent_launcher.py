"""The agent believes little of what its launcher says (podbay.agent.launcher).

Root of the commands' namespace can signal the launcher and, on a kernel
that let it, could answer in its place: so an answer naming a pid that is
not a child of the launcher (the agent itself, its group, init, anyone else),
an answer too long or none at all gets the launcher killed and the command
refused; an exit for a pid it did not start is ignored. Here the launcher is
played by the test over real sockets, with a real process as its pid.
"""

from __future__ import annotations

import errno
import os
import socket
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from podbay.agent import launcher
from podbay.agent.launcher import Launcher
from podbay.agent.reaper import Reaper
from podbay.errors import LaunchFailed

REQUEST = {
    "argv": ["true"],
    "cwd": "/w",
    "env": {},
    "ids": None,
    "terminal": False,
    "given": [False, False, False],
}


@dataclass
class Played:
    agent_side: Launcher
    requests: socket.socket  # the launcher's ends
    exits: socket.socket
    process: subprocess.Popen[bytes]  # stands for the launcher process
    child: int  # a real child of it

    def answer(self, pid: int, code: int = 0, failed: int = 0, reason: str = "") -> None:
        self.requests.sendall(launcher._answer(pid, code, failed, reason))


@pytest.fixture
def played() -> Iterator[Played]:
    process = subprocess.Popen(
        ["sh", "-c", "sleep 60 & echo $!; wait"], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL
    )
    assert process.stdout is not None
    child = int(process.stdout.readline())
    requests, their_requests = socket.socketpair()
    exits, their_exits = socket.socketpair()
    requests.settimeout(5)
    yield Played(
        Launcher(process.pid, requests, exits), their_requests, their_exits, process, child
    )
    process.kill()
    process.wait()
    process.stdout.close()
    subprocess.run(["kill", str(child)], check=False)
    for sock in (requests, exits, their_requests, their_exits):
        sock.close()


def test_an_honest_answer_is_the_pid(played: Played) -> None:
    played.answer(played.child)
    assert played.agent_side.spawn(dict(REQUEST), []) == played.child
    assert played.agent_side.alive
    assert played.child in played.agent_side.running


@pytest.mark.parametrize("who", ["agent", "group", "init", "launcher", "stranger"])
def test_a_pid_not_its_child_gets_the_launcher_killed(played: Played, who: str) -> None:
    pids = {
        "agent": os.getpid(),
        "group": os.getpgrp(),
        "init": 1,
        "launcher": played.process.pid,
        "stranger": os.getppid(),
    }
    played.answer(pids[who])
    with pytest.raises(LaunchFailed, match="not its own"):
        played.agent_side.spawn(dict(REQUEST), [])
    assert not played.agent_side.alive
    assert played.process.wait(5) == -9


def test_a_long_answer_or_none_gets_the_launcher_killed(played: Played) -> None:
    played.requests.sendall(launcher._ANSWER.pack(0, 0, 3, 60000) + b"x" * launcher.MAX_REASON)
    with pytest.raises(LaunchFailed, match="did not answer"):
        played.agent_side.spawn(dict(REQUEST), [])
    assert played.process.wait(5) == -9


def test_silence_gets_the_launcher_killed(played: Played) -> None:
    played.agent_side.requests.settimeout(0.2)
    with pytest.raises(LaunchFailed, match="did not answer"):
        played.agent_side.spawn(dict(REQUEST), [])
    assert played.process.wait(5) == -9


def test_a_failed_start_names_what_was_missing(played: Played) -> None:
    played.answer(0, errno.ENOENT, 2, "No such file or directory")
    with pytest.raises(LaunchFailed) as failed:
        played.agent_side.spawn(dict(REQUEST), [])
    assert failed.value.error is not None
    assert failed.value.error.filename == "/w"
    assert played.agent_side.alive  # a refusal is no lie


def _exits_delivered(played: Played, exits: list[tuple[int, int]]) -> dict[int, int]:
    """Start a command (pid: the played launcher's child), then play ``exits``
    (-1: that command's pid) and the launcher's end; the codes the agent's
    reaper delivered, for that pid and for a pid 4000000 it was not given."""
    reaper = Reaper()
    codes: dict[int, int] = {}
    played.answer(played.child)
    with reaper.lock:
        pid = played.agent_side.spawn(dict(REQUEST), [])
        for registered in (pid, 4_000_000):
            reaper.register(registered, lambda code, p=registered: codes.__setitem__(p, code))
    reader = threading.Thread(target=played.agent_side._read_exits, args=(reaper,))
    reader.start()
    for exited, code in exits:
        played.exits.sendall(launcher._EXIT.pack(pid if exited == -1 else exited, code))
    played.exits.close()  # the launcher went away
    played.process.wait(5)
    played.agent_side._reaped()
    reader.join(5)
    return codes


def test_exits_reach_the_reaper_only_for_commands_it_started(played: Played) -> None:
    assert _exits_delivered(played, [(4_000_000, 0), (-1, 7)]) == {played.child: 7}


def test_a_command_whose_status_went_with_the_launcher_counts_as_killed(played: Played) -> None:
    # Not the agent's child once the launcher is gone: its status went with it.
    assert _exits_delivered(played, []) == {played.child: launcher.LOST_CODE}


def test_a_launcher_gone_while_starting_says_the_command_may_have_run(played: Played) -> None:
    # Its end seen by the exits reader meanwhile (a command may kill it at once).
    threading.Timer(0.2, played.agent_side.kill).start()
    with pytest.raises(LaunchFailed, match="may have run"):
        played.agent_side.spawn(dict(REQUEST), [])


def test_a_request_reads_back_as_it_was_sent() -> None:
    sent = {
        "argv": ["sh", "-c", "echo é"],
        "cwd": "/w",
        "env": {"PATH": "/a:/b", "EMPTY": "", "X": "1=2"},
        "ids": (1000, 1000, [4, 5]),
        "terminal": True,
        "given": [True, False, True],
    }
    assert launcher.decode_request(launcher.encode_request(sent)) == sent


def test_a_request_names_the_paths_to_try_as_subprocess_would() -> None:
    # The launcher program tries these in turn (the PATH search of the command's env).
    body = launcher.encode_request({**REQUEST, "env": {"PATH": "/a:/b"}})
    strings = body[launcher._BODY.size :].split(b"\0")
    assert strings[:4] == [b"/w", b"/a/true", b"/b/true", b"true"]
    body = launcher.encode_request({**REQUEST, "argv": ["./x"], "env": {"PATH": "/a"}})
    assert body[launcher._BODY.size :].split(b"\0")[:3] == [b"/w", b"./x", b"./x"]


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"env": {"A=B": "x"}}, "illegal environment variable name"),
        ({"env": {"A": "x\0"}}, "embedded null byte"),
        ({"cwd": "/w\0"}, "embedded null byte"),
    ],
)
def test_what_no_environment_can_hold_is_refused_before_sending(
    change: dict[str, object], reason: str
) -> None:
    with pytest.raises(ValueError, match=reason):
        launcher.encode_request({**REQUEST, **change})


def test_a_request_past_what_execve_takes_is_refused_as_too_long() -> None:
    # Before any launcher is asked (the program reads at most MAX_REQUEST).
    argv = ["echo", "x" * launcher.MAX_REQUEST]
    with pytest.raises(LaunchFailed) as failed:
        launcher.spawn(Reaper(), argv, "/", {}, (None, None, None), None)
    assert failed.value.error is not None
    assert failed.value.error.errno == errno.E2BIG
