"""``podbay sandbox ...`` as a person types it (the installed ``podbay`` script,
a real server): which verbs may create a sandbox, what ``cp`` keeps, and the
one-line answers a newcomer meets first."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from podbay import SandboxClient

pytestmark = pytest.mark.root

PODBAY = str(Path(sys.executable).parent / "podbay")


@pytest.fixture
def podbay(platform: Any) -> Any:
    def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        base = {**os.environ, "ASTRO_AUTHZ_TOKEN": platform.token}
        base.pop("PODBAY_SERVER_URL", None)
        return subprocess.run(
            [PODBAY, "sandbox", *args],
            capture_output=True,
            text=True,
            env={**base, **(env or {})},
            timeout=120,
        )

    return run


def not_found(done: subprocess.CompletedProcess[str]) -> bool:
    return (
        done.returncode == 1
        and done.stderr.startswith("podbay: 404 SANDBOX_NOT_FOUND:")
        and len(done.stderr.splitlines()) == 1
    )


@pytest.mark.parametrize(
    "verb",
    [
        ["ls", "{name}"],
        ["ls", "{name}", "/etc"],
        ["ps", "{name}"],
        ["kill", "{name}", "p_1"],
        ["kill", "{name}", "p_1", "--signal", "TERM"],
        ["cp", "{name}:/etc/hostname", "{tmp}/hostname"],
        ["ports", "{name}"],
        ["url", "{name}", "8080"],
    ],
    ids=lambda v: " ".join(v[:1] + v[2:3]),
)
def test_verbs_that_only_look_do_not_create_a_sandbox(
    podbay: Any, name: str, platform: Any, tmp_path: Path, verb: list[str]
) -> None:
    done = podbay(*(a.format(name=name, tmp=tmp_path) for a in verb))
    assert not_found(done), (done.returncode, done.stderr)
    assert not (tmp_path / "hostname").exists()
    assert not_found(podbay("get", name))
    with SandboxClient(identity_token=platform.token, server_url=platform.url) as client:
        assert name not in [r.name for r in client.list()]


def test_verbs_that_use_a_sandbox_create_it(podbay: Any, name: str, tmp_path: Path) -> None:
    (tmp_path / "f").write_text("x")
    assert podbay("cp", str(tmp_path / "f"), f"{name}:f").returncode == 0
    # Once it exists the looking verbs answer as before.
    assert podbay("ls", name).stdout.split() == ["f"]
    assert podbay("ps", name, "--json").stdout.strip() == "[]"


def test_stop_says_the_state_get_shows(podbay: Any, name: str) -> None:
    assert podbay("attach", name).returncode == 0
    stopped = podbay("stop", name)
    assert (stopped.returncode, stopped.stdout) == (0, f"suspended {name}\n")
    assert json.loads(podbay("get", name, "--json").stdout)["state"] == "suspended"
    assert json.loads(podbay("stop", name, "--json").stdout) == {"name": name, "suspended": True}


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_cp_keeps_modes_both_ways(podbay: Any, name: str, tmp_path: Path) -> None:
    script = tmp_path / "run.sh"
    script.write_text("#!/bin/sh\necho ran\n")
    script.chmod(0o755)
    secret = tmp_path / "secret"
    secret.write_text("s")
    secret.chmod(0o640)
    tree = tmp_path / "tree"
    (tree / "private").mkdir(parents=True)
    (tree / "private").chmod(0o700)
    (tree / "bin.sh").write_text("#!/bin/sh\necho tree\n")
    (tree / "bin.sh").chmod(0o755)
    (tree / "ro.txt").write_text("r")
    (tree / "ro.txt").chmod(0o444)

    for local, remote in ((script, "run.sh"), (secret, "secret"), (tree, "tree")):
        done = podbay("cp", str(local), f"{name}:{remote}")
        assert done.returncode == 0, done.stderr
    listed = podbay(
        "exec", name, "--", "stat", "-c", "%n %a %U",
        "run.sh", "secret", "tree", "tree/private", "tree/bin.sh", "tree/ro.txt",
    )  # fmt: skip
    assert listed.stdout.splitlines() == [
        "run.sh 755 root",
        "secret 640 root",
        "tree 755 root",
        "tree/private 700 root",
        "tree/bin.sh 755 root",
        "tree/ro.txt 444 root",
    ], listed.stderr
    assert podbay("exec", name, "--", "./run.sh").stdout == "ran\n"

    # Back: modes kept (but group/other write, dropped as tar's data filter does), owned here.
    podbay("exec", name, "--", "sh", "-c", "chmod 0775 run.sh; chmod 4755 tree/bin.sh")
    back = tmp_path / "back"
    back.mkdir()
    for remote, local in (("run.sh", back / "run.sh"), ("secret", back), ("tree", back / "t")):
        done = podbay("cp", f"{name}:{remote}", str(local))
        assert done.returncode == 0, done.stderr
    assert mode(back / "run.sh") == 0o755
    assert mode(back / "secret") == 0o640
    assert mode(back / "t" / "private") == 0o700
    assert mode(back / "t" / "bin.sh") == 0o755
    assert mode(back / "t" / "ro.txt") == 0o444
    uid = os.getuid()
    assert {p.stat().st_uid for p in [back / "run.sh", back / "secret", *back.rglob("*")]} == {uid}
    assert subprocess.run([back / "run.sh"], capture_output=True, text=True).stdout == "ran\n"


def test_a_command_that_cannot_start_exits_as_a_shell_would(podbay: Any, name: str) -> None:
    missing = podbay("exec", name, "--", "no-such-command")
    assert missing.returncode == 127, missing.stderr
    assert "no-such-command" in missing.stderr
    podbay("exec", name, "--", "sh", "-c", "echo 'echo hi' > plain.sh")
    denied = podbay("exec", name, "--", "./plain.sh")
    assert denied.returncode == 126, denied.stderr
    # The full command (--json, no quick path) and `run` answer alike.
    assert podbay("exec", name, "--json", "--", "no-such-command").returncode == 127
    assert podbay("run", name, "--", "no-such-command").returncode == 127


def test_a_server_that_is_not_running_is_named(podbay: Any) -> None:
    from test_client_cli import unsigned_token

    down = podbay("list", env={"ASTRO_AUTHZ_TOKEN": unsigned_token("http://127.0.0.1:9")})
    assert down.returncode == 2
    assert down.stderr.startswith("podbay: unavailable:")
    assert "is the server running at http://127.0.0.1:9?" in down.stderr
    assert len(down.stderr.splitlines()) == 1


def test_no_token_names_the_option(podbay: Any) -> None:
    env = {k: v for k, v in os.environ.items() if k != "ASTRO_AUTHZ_TOKEN"}
    done = subprocess.run([PODBAY, "sandbox", "list"], capture_output=True, text=True, env=env)
    assert done.returncode == 2
    assert done.stderr == "podbay: no identity token: pass --token or set ASTRO_AUTHZ_TOKEN\n"
    assert (
        "--token"
        in subprocess.run(
            [PODBAY, "sandbox", "list", "--help"], capture_output=True, text=True
        ).stdout
    )


def test_a_piped_shell_has_no_terminal(podbay: Any, name: str, platform: Any) -> None:
    script = "echo hi\necho err >&2\ntest -t 0 || echo no-tty\nexit 3\n"
    env = {**os.environ, "ASTRO_AUTHZ_TOKEN": platform.token}
    env.pop("PODBAY_SERVER_URL", None)
    done = subprocess.run(
        [PODBAY, "sandbox", "shell", name],
        input=script,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    # No echo of the input, no prompt, no bracketed-paste switch (ESC[?2004h).
    assert (done.returncode, done.stdout, done.stderr) == (3, "hi\nno-tty\n", "err\n")
    catted = subprocess.run(
        [PODBAY, "sandbox", "shell", name, "--", "cat"],
        input="line\n",
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert (catted.returncode, catted.stdout) == (0, "line\n")


def test_a_token_without_an_issuer_names_the_server_option(podbay: Any) -> None:
    from test_client_cli import unsigned_token

    no_iss = unsigned_token("x").replace(unsigned_token("x").split(".")[1], "e30")  # "{}"
    done = podbay("list", env={"ASTRO_AUTHZ_TOKEN": no_iss})
    assert done.returncode == 2
    assert done.stderr == "podbay: identity token has no 'iss' claim; pass --server URL\n"
