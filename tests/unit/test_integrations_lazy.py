"""Importing podbay, its client, CLI or the integrations package never imports a
framework: each integration is loaded only by the user (or ``podbay mcp``)."""

from __future__ import annotations

import subprocess
import sys

FRAMEWORKS = ("mcp", "smolagents", "inspect_ai", "deepagents", "agents")


def test_importing_podbay_imports_no_framework() -> None:
    code = (
        "import sys, podbay, podbay.client, podbay.integrations, podbay.cli.main\n"
        "from podbay import SandboxClient, AsyncSandboxClient\n"
        f"loaded = [m for m in {FRAMEWORKS!r} if m in sys.modules]\n"
        "assert not loaded, loaded\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def test_podbay_mcp_is_listed_without_importing_mcp() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "podbay.cli.main", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "mcp" in done.stdout
