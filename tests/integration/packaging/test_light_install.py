"""``pip install podbay`` (no extras) is the SDK and the client-side CLI only.

A fresh virtualenv, podbay installed from this tree with no extras (its three
dependencies come from PyPI): the SDK imports, no server package is present,
and a server command says which extra to install instead of a traceback.

pip is this suite's own, pointed at the new environment (``pip --python``):
seeding pip into each virtualenv was half of this module's time, and is not
what it checks. Its download cache is kept across runs
(``$PODBAY_TEST_PIP_CACHE``), which spares the downloads where the index's
answers may be cached (PyPI's; not every mirror's).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
#: Distributions that only the ``server`` extra may bring (lower-case, as pip lists them).
SERVER_ONLY = {
    "starlette",
    "uvicorn",
    "cryptography",
    "prometheus-client",
    "pyjwt",
    "pyyaml",
    "httptools",
    "uvloop",
}


PIP_CACHE = os.environ.get("PODBAY_TEST_PIP_CACHE", "/var/tmp/podbay-test-pip-cache")


def run(argv: list[str], timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env={
            "PATH": "/usr/bin:/bin",
            "PIP_DISABLE_PIP_VERSION_CHECK": "1",
            "PIP_CACHE_DIR": PIP_CACHE,
            "HOME": "/nonexistent",
        },
    )


def pip(venv: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), *args])


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    home = tmp_path_factory.mktemp("light") / "venv"
    made = run([sys.executable, "-m", "venv", "--without-pip", str(home)])
    assert made.returncode == 0, made.stderr
    installed = pip(home, "install", "-q", str(ROOT))
    assert installed.returncode == 0, installed.stdout + installed.stderr
    return home


def test_the_sdk_imports(venv: Path) -> None:
    done = run(
        [
            str(venv / "bin" / "python"),
            "-c",
            "import podbay; print(podbay.SandboxClient.__name__, "
            "podbay.AsyncSandboxClient.__name__)",
        ]
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["SandboxClient", "AsyncSandboxClient"]


def test_no_server_package_is_installed(venv: Path) -> None:
    listed = pip(venv, "list", "--format=json")
    assert listed.returncode == 0, listed.stderr
    names = {entry["name"].lower() for entry in json.loads(listed.stdout)}
    assert {"podbay", "httpx", "anyio", "click"} <= names
    assert names & SERVER_ONLY == set()


def test_the_client_cli_works(venv: Path) -> None:
    done = run([str(venv / "bin" / "podbay"), "sandbox", "--help"])
    assert done.returncode == 0, done.stderr
    assert "exec" in done.stdout


@pytest.mark.parametrize("command", ["serve", "deployment", "doctor", "gc", "dev"])
def test_a_server_command_names_the_extra(venv: Path, command: str) -> None:
    done = run([str(venv / "bin" / "podbay"), command])
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert lines == [
        f"Error: podbay {command} needs the server extra: pip install 'podbay[server]'"
    ], done.stderr
