"""The Python snippets of README.md and docs/client.md run as printed."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.root

ROOT = Path(__file__).resolve().parents[3]
DOCS = [ROOT / "README.md", ROOT / "docs" / "client.md"]
FENCE = re.compile(r"```python\n(.*?)```", re.DOTALL)


def snippets() -> list[Any]:
    found = []
    for doc in DOCS:
        if doc.exists():
            for i, code in enumerate(FENCE.findall(doc.read_text())):
                found.append(pytest.param(code, id=f"{doc.name}-{i}"))
    return found


@pytest.mark.parametrize("code", snippets())
def test_snippet_runs_as_printed(code: str, platform: Any) -> None:
    env = {**os.environ, "ASTRO_AUTHZ_TOKEN": platform.token}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() in ("4", "hi")
    from podbay import SandboxClient

    with SandboxClient(identity_token=platform.token) as client:
        client.delete("thread-42")


def cli_snippet() -> str:
    """The README's CLI snippet (the ```sh block after the SDK's)."""
    blocks = re.findall(r"```sh\n(.*?)```", (ROOT / "README.md").read_text(), re.DOTALL)
    return next(b for b in blocks if "podbay sandbox cp" in b)


def test_the_readme_cli_snippet_runs_as_printed(platform: Any, tmp_path: Path) -> None:
    env = {
        **os.environ,
        "ASTRO_AUTHZ_TOKEN": platform.token,
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
    }
    env.pop("PODBAY_SERVER_URL", None)
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", cli_snippet()],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr
    from podbay import SandboxClient

    with SandboxClient(identity_token=platform.token) as client:
        try:
            copied = client.read_file("thread-42", "/workspace/data.csv")
            assert copied == (tmp_path / "data.csv").read_text()
            assert "thread-42" in [r["name"] for r in json.loads(done.stdout.splitlines()[-1])]
        finally:
            client.delete("thread-42")
