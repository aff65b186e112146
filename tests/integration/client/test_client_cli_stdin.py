"""``podbay sandbox exec`` passes a piped standard input through, on the quick
path and the full one, runs as ``--user``, and exits with the command's code."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.root

QUICK = "import sys; from podbay.cli.entry import main; sys.argv[0] = 'podbay'; main()"
FULL = "import sys; from podbay.cli.main import main; sys.argv[0] = 'podbay'; main()"


def _podbay(platform: Any, path: str, *args: str, stdin: Any) -> subprocess.CompletedProcess:
    env = {**os.environ, "ASTRO_AUTHZ_TOKEN": platform.token}
    env.pop("PODBAY_SERVER_URL", None)
    return subprocess.run(
        [sys.executable, "-c", path, "sandbox", "exec", *args],
        stdin=stdin,
        capture_output=True,
        env=env,
        timeout=120,
    )


@pytest.mark.parametrize("path", [QUICK, FULL], ids=["quick", "full"])
def test_piped_stdin_user_and_exit_code(
    platform: Any, name: str, path: str, tmp_path: Path
) -> None:
    with subprocess.Popen(["echo", "hi"], stdout=subprocess.PIPE) as echo:
        done = _podbay(platform, path, name, "--", "cat", stdin=echo.stdout)
    assert (done.stdout, done.returncode) == (b"hi\n", 0), done.stderr
    data = os.urandom(3 * 1024 * 1024)
    source = tmp_path / "data"
    source.write_bytes(data)
    with source.open("rb") as f:
        done = _podbay(platform, path, name, "--", "sh", "-c", "sha256sum; exit 5", stdin=f)
    assert done.returncode == 5
    assert done.stdout.split()[0].decode() == hashlib.sha256(data).hexdigest()
    with source.open("rb") as f:
        done = _podbay(
            platform,
            path,
            name,
            "--user",
            "user",
            "--no-stdin",
            "--",
            "sh",
            "-c",
            "id -un; wc -c",
            stdin=f,
        )
    assert (done.stdout, done.returncode) == (b"user\n0\n", 0), done.stderr
    done = _podbay(platform, path, name, "--", "cat", stdin=subprocess.DEVNULL)
    assert (done.stdout, done.returncode) == (b"", 0)
