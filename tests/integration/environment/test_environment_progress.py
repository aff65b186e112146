"""An attach that waits for a declared environment shows the build's steps:
the 202 body carries ``progress`` (step, steps, what it does, seconds so far),
the SDK hands each 202 to ``on_preparing``, and ``podbay sandbox attach`` on a
terminal prints a line per step, while in a pipe and with ``--json`` it prints
nothing more than before. One real layer build, three clients waiting on it."""

from __future__ import annotations

import os
import pty
import re
import select
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from podbay.client import SandboxClient
from podbay.testing.platform import PlatformServer
from podbay.wire.control import Preparing

pytestmark = pytest.mark.root

SPEC = """\
name: progress-agent
sandbox:
  toolchain: never
  packages: [tree]
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PlatformServer]:
    with PlatformServer.start(tmp_path_factory.mktemp("progress")) as s:
        yield s


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "podbay.cli.main", "sandbox", *args]


def on_pty(argv: list[str], env: dict[str, str]) -> tuple[int, str, str]:
    """Run ``argv`` with stderr on a terminal (stdout a pipe): status, stdout, stderr."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=slave, env=env, text=True
    )
    os.close(slave)
    drawn = b""
    while True:
        ready, _, _ = select.select([master], [], [], 600)
        assert ready, "the attach drew nothing for 10 minutes"
        try:
            chunk = os.read(master, 4096)
        except OSError:  # the other side closed: the command ended
            break
        if not chunk:
            break
        drawn += chunk
    os.close(master)
    assert proc.stdout is not None
    with proc.stdout:
        out = proc.stdout.read()
    return proc.wait(60), out, drawn.decode()


def test_attach_shows_the_build_on_a_terminal_only(server: PlatformServer) -> None:
    token = server.create_deployment("progress-agent", SPEC)
    env = {**os.environ, "ASTRO_AUTHZ_TOKEN": token}
    env.pop("PODBAY_SERVER_URL", None)
    # The first attach starts the build, and answers 202 with step 1 already.
    first = server.attach(token, "sdk", headers={"Prefer": "respond-async"})
    assert first.status_code == 202, first.text
    body = first.json()
    assert body["name"] == "sdk"
    assert body["state"] == "creating"
    steps = body["progress"]["steps"]  # the plan's (apt-get update, install, ...) and two
    assert body["progress"]["step"] == 1
    assert steps >= 4
    assert body["progress"]["doing"] == "start the build machine"

    seen: list[Preparing] = []
    results: dict[str, Any] = {}

    def sdk() -> None:
        with SandboxClient(
            identity_token=token, server_url=server.base_url, on_preparing=seen.append
        ) as client:
            results["sdk"] = client.attach("sdk")

    def piped(name: str, *extra: str) -> None:
        results[name] = subprocess.run(
            cli("attach", name, *extra), capture_output=True, text=True, env=env
        )

    waiting = [
        threading.Thread(target=sdk),
        threading.Thread(target=piped, args=("piped",)),
        threading.Thread(target=piped, args=("as-json", "--json")),
    ]
    for thread in waiting:
        thread.start()
    status, out, drawn = on_pty(cli("attach", "on-a-terminal"), env)
    for thread in waiting:
        thread.join(600)

    assert status == 0, drawn
    assert out  # what it printed before
    lines = drawn.replace("\r\n", "\n").splitlines()
    # A line per step it saw, each naming the step, what it does and the seconds.
    building = [line for line in lines if "building its environment: step " in line]
    assert building, drawn
    step = re.compile(
        rf"podbay: sandbox on-a-terminal: building its environment: step \d/{steps} .+ \(\d+ s\)"
    )
    assert all(step.fullmatch(line) for line in building), building

    assert results["sdk"].state == "running"
    assert seen
    assert all(p.name == "sdk" and p.progress is not None for p in seen)
    assert {p.progress.steps for p in seen if p.progress} == {steps}
    numbers = [p.progress.step for p in seen if p.progress]
    assert numbers == sorted(numbers)
    for name in ("piped", "as-json"):
        done = results[name]
        assert done.returncode == 0, done.stderr
        assert done.stderr == "", done.stderr  # nothing more than before in a pipe or --json
