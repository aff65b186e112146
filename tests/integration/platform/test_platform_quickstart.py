"""The README's quick start runs as printed (on another port, data
directory and scratch directory, so it cannot disturb a real install)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from podbay.testing.platform import PlatformServer, free_port

pytestmark = pytest.mark.root
ROOT = Path(__file__).resolve().parents[3]
DOC = ROOT / "README.md"


def quickstart() -> str:
    text = DOC.read_text()
    section = text.split("## Quick start", 1)[1]
    return re.search(r"```sh\n(.*?)```", section, re.S).group(1)


def test_quickstart_runs_as_printed(tmp_path):
    port = free_port()
    script = (
        quickstart().replace("127.0.0.1:8700", f"127.0.0.1:{port}").replace("/tmp/", f"{tmp_path}/")
    )
    server = PlatformServer(tmp_path, {}, port)  # for its settings and clean-up only
    env = {
        **server.env,
        "PODBAY_DATA_DIR": str(server.data_dir),
        "PODBAY_SERVER_PORT": str(port),
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
    }
    proc = subprocess.Popen(
        ["bash", "-euo", "pipefail", "-c", script],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        cwd=ROOT,
    )
    try:
        out, err = proc.communicate(timeout=240)
        assert proc.returncode == 0, err
        result = json.loads(out.strip().splitlines()[-1])
        assert result["exit_code"] == 0
        assert result["stdout"] == "4\n"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)  # the background `podbay serve`
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                os.killpg(proc.pid, 0)  # raises once the whole group is gone
                time.sleep(0.1)
        server.close()
