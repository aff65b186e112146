"""``podbay dev up`` / ``dev down`` for a project folder, against the real server it starts."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from podbay.cli import serverpid
from podbay.testing.platform import PlatformServer, free_port

pytestmark = pytest.mark.root


def dev(project: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "podbay.cli.main", "dev", *args],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def servers_of(data_dir: Path) -> list[int]:
    """Pids of ``podbay serve`` processes using ``data_dir``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"serve" in cmdline and str(data_dir).encode() in cmdline:
                found.append(int(entry.name))
    return found


def test_dev_up_registers_the_project_and_down_deletes_its_sandboxes(tmp_path: Path) -> None:
    port = free_port()
    helper = PlatformServer(tmp_path, {}, port)  # its environment, data dir and clean-up
    env = {**helper.env, "PODBAY_DATA_DIR": str(helper.data_dir)}
    listen = ["--listen", f"127.0.0.1:{port}"]
    project = tmp_path / "my-agent"
    project.mkdir()
    (project / "astropods.yml").write_text(
        "name: my-agent\nsandbox:\n  toolchain: never\n"
        "  setup: ['echo one > v', 'echo one > /opt/declared']\n"
    )
    try:
        up = dev(project, env, "up", *listen)
        assert up.returncode == 0, up.stderr
        line = up.stdout.strip().splitlines()[-1]
        assert line.startswith("export ASTRO_AUTHZ_TOKEN=")
        token = line.split("=", 1)[1]
        assert servers_of(helper.data_dir) == [serverpid.recorded(helper.data_dir)]  # one, kept

        api = httpx.Client(
            base_url=f"http://127.0.0.1:{port}",
            timeout=60,
            headers={"authorization": f"Bearer {token}"},
        )

        def run(sandbox: str, line: str) -> str:
            handle = api.put(f"/api/v1/sandboxes/{sandbox}").json()
            out = api.post(
                handle["endpoint"] + "/v1/exec",
                headers=handle["headers"],
                json={"command": ["sh", "-c", line]},
            ).json()
            return str(out["stdout"])

        assert run("t1", "cat v /opt/declared; echo mine > mine; ln -s mine link") == "one\none\n"

        # Unchanged: reused, nothing deleted, same server.
        again = dev(project, env, "up", *listen)
        assert again.returncode == 0
        assert "reusing" in again.stderr
        assert api.get("/api/v1/sandboxes/t1").status_code == 200
        assert len(servers_of(helper.data_dir)) == 1

        # A changed file applies on the next up as a carry-over would: each
        # sandbox is made anew (the declared software installed anew) with its
        # /workspace kept (where the new setup wrote a file it has, its own).
        (project / "astropods.yml").write_text(
            "name: my-agent\nsandbox:\n  toolchain: never\n"
            "  setup: ['echo two > v', 'echo two > /opt/declared']\n"
        )
        changed = dev(project, env, "up", *listen)
        assert changed.returncode == 0, changed.stderr
        assert "changed" in changed.stderr, changed.stderr
        assert "sandbox t1 made anew with the new declaration, /workspace kept" in changed.stderr
        assert run("t1", "cat /opt/declared mine link v") == "two\nmine\nmine\none\n"
        assert run("t2", "cat v /opt/declared") == "two\ntwo\n"
        assert not list((helper.data_dir / "dev-workspaces").iterdir())

        down = dev(project, env, "down", *listen)
        assert down.returncode == 0, down.stderr
        assert "deleted 2 sandbox" in down.stderr
        assert api.get("/api/v1/sandboxes").json() == {"sandboxes": []}
        api.close()
        assert len(servers_of(helper.data_dir)) == 1  # down alone leaves the server

        # --server stops the server up started, by its pid file.
        stopped = dev(project, env, "down", "--server", *listen)
        assert stopped.returncode == 0, stopped.stderr
        assert "stopped podbay serve" in stopped.stderr
        assert servers_of(helper.data_dir) == []
        assert not serverpid.pid_file(helper.data_dir).exists()
        again = dev(project, env, "down", "--server", *listen)
        assert again.returncode == 1
        assert "no server started by `podbay dev up`" in again.stderr

        # A bad section fails before anything starts (no server), naming the field.
        (project / "astropods.yml").write_text("name: my-agent\nsandbox:\n  toolchain: sure\n")
        bad = dev(project, env, "up", *listen)
        assert bad.returncode != 0
        assert "sandbox.toolchain" in bad.stderr
        assert "Traceback" not in bad.stderr
    finally:
        for pid in servers_of(helper.data_dir):
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 20
        while servers_of(helper.data_dir) and time.monotonic() < deadline:
            time.sleep(0.1)
        helper.close()
