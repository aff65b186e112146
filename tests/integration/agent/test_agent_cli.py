"""``podbay agent --socket`` and ``--listen`` as a user starts them."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from pathlib import Path

import httpx


def _start(args: list[str]) -> subprocess.Popen[str]:
    podbay = Path(sys.executable).parent / "podbay"
    return subprocess.Popen([str(podbay), "agent", *args], stderr=subprocess.PIPE, text=True)


def _stop(proc: subprocess.Popen[str]) -> None:
    """SIGTERM is a clean exit (0); never leave the agent behind, even on failure."""
    proc.terminate()
    try:
        code = proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)
        raise AssertionError("the agent did not exit within 30 s of SIGTERM") from None
    finally:
        if proc.stderr is not None:
            proc.stderr.close()
    assert code == 0


def test_socket_mode_serves_info_exec_processes_and_files(tmp_path: Path) -> None:
    sock = tmp_path / "x.sock"
    proc = _start(["--socket", str(sock), "--workspace", str(tmp_path)])
    try:
        assert proc.stderr is not None
        assert "serving on" in proc.stderr.readline()
        assert sock.stat().st_mode & 0o777 == 0o600
        with httpx.Client(
            transport=httpx.HTTPTransport(uds=str(sock)), base_url="http://agent"
        ) as client:
            assert {"files", "files.trailing-digest", "pty", "ports"} <= set(
                client.get("/v1/info").json()["features"]
            )
            assert client.post("/v1/exec", json={"command": ["pwd"]}).json()["stdout"] == (
                f"{tmp_path}\n"
            )
            assert client.post("/v1/processes", json={"command": ["true"]}).status_code == 200
            assert client.get("/v1/files/list", params={"path": "."}).status_code == 200
    finally:
        _stop(proc)
    assert not sock.exists()  # removed on the way out


def test_listen_mode_on_tcp(tmp_path: Path) -> None:
    proc = _start(["--listen", "127.0.0.1:0", "--workspace", str(tmp_path)])
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        match = re.search(r"\('127\.0\.0\.1', (\d+)\)", line)
        assert match, line
        deadline = time.monotonic() + 5
        while True:
            try:
                resp = httpx.get(f"http://127.0.0.1:{match.group(1)}/v1/info")
                break
            except httpx.ConnectError:
                assert time.monotonic() < deadline
                time.sleep(0.02)
        assert resp.status_code == 200
    finally:
        _stop(proc)


def test_bad_options_exit_2(tmp_path: Path) -> None:
    podbay = Path(sys.executable).parent / "podbay"
    done = subprocess.run(
        [str(podbay), "agent", "--fd", "3", "--env-file", str(tmp_path / "missing.json")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2
    assert "env file" in done.stderr
