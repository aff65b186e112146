"""deploy/systemd: the unit files pass ``systemd-analyze verify`` without a
word of complaint, the load balancer's example passes ``haproxy -c`` and
starts for real (on loopback, under the descriptor limit it ships with), and
the environment files name the settings the units' roles read."""

from __future__ import annotations

import http.server
import re
import resource
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[3]
SYSTEMD = ROOT / "deploy" / "systemd"
INSTALLED_PODBAY = "/opt/podbay/bin/podbay"


def tool(name: str) -> str:
    found = shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin")
    assert found, f"{name} missing (./run installs it)"
    return found


def verify(units: list[Path]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [tool("systemd-analyze"), "verify", "--man=no", *map(str, units)],
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture
def units(tmp_path: Path) -> list[Path]:
    """The units as shipped, but starting this checkout's podbay (verify wants
    ExecStart's program to exist)."""
    here = str(Path(sys.executable).parent / "podbay")
    copies = []
    for unit in sorted(SYSTEMD.glob("*.service")):
        text = unit.read_text()
        assert INSTALLED_PODBAY in text
        copy = tmp_path / unit.name
        copy.write_text(text.replace(INSTALLED_PODBAY, here))
        copies.append(copy)
    assert [u.name for u in copies] == ["podbay-control.service", "podbay-node.service"]
    return copies


def test_unit_files_verify_cleanly(units: list[Path]) -> None:
    result = verify(units)
    assert result.returncode == 0, result.stderr
    assert result.stderr == "", result.stderr


def test_verify_complains_about_a_broken_unit(units: list[Path]) -> None:
    """The check above can fail: systemd-analyze reports what it ignores."""
    broken = units[1].read_text().replace("KillMode=process", "KilMode=process")
    units[1].write_text(broken)
    assert "Unknown key" in verify(units).stderr


def test_units_start_their_roles_with_their_env_files() -> None:
    for role in ("control", "node"):
        text = (SYSTEMD / f"podbay-{role}.service").read_text()
        assert f"ExecStart={INSTALLED_PODBAY} {role} " in text
        assert f"EnvironmentFile=/etc/podbay/{role}.env" in text
        assert (SYSTEMD / f"{role}.env").exists()
    control = (SYSTEMD / "control.env").read_text()
    node = (SYSTEMD / "node.env").read_text()
    assert "PODBAY_STORE_URL=postgresql://" in control
    assert "PODBAY_STORE_URL" not in node  # nodes never touch the store
    for both in ("PODBAY_CLUSTER_ENROLLMENT_TOKEN=",):
        assert both in control
        assert both in node
    for name in ("PODBAY_NODE_CONTROL_URL=", "PODBAY_NODE_ADVERTISE_URL="):
        assert name in node


def test_haproxy_example_is_valid() -> None:
    result = subprocess.run(
        [tool("haproxy"), "-c", "-f", str(SYSTEMD / "haproxy.cfg")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "option httpchk GET /healthz" in (SYSTEMD / "haproxy.cfg").read_text()


def _shipped_nofile() -> int:
    for line in (SYSTEMD / "haproxy-limits.conf").read_text().splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "LimitNOFILE":
            return int(value)
    raise AssertionError("haproxy-limits.conf sets no LimitNOFILE")


class _Replica(http.server.BaseHTTPRequestHandler):
    """A control replica as haproxy sees it: /healthz 200, and its name."""

    def do_GET(self) -> None:
        body = self.server.server_address[1].to_bytes(2, "big").hex().encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def replicas() -> Iterator[list[int]]:
    servers = [http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Replica) for _ in range(2)]
    threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in servers]
    for t in threads:
        t.start()
    yield [int(s.server_address[1]) for s in servers]
    for s in servers:
        s.shutdown()
        s.server_close()


def _on_loopback(config: str, port: int, replicas: list[int]) -> str:
    out = config.replace("bind :8700", f"bind 127.0.0.1:{port}")
    for i, replica in enumerate(replicas, 1):
        out = out.replace(f"pb{i}.example.internal:8700", f"127.0.0.1:{replica}")
    assert "example.internal:8700 check" not in out
    assert f"127.0.0.1:{port}" in out
    return out


def _start(config: Path, nofile: int) -> subprocess.Popen[str]:
    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

    return subprocess.Popen(
        [tool("haproxy"), "-db", "-f", str(config)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=limit,
    )


def test_haproxy_example_starts_and_balances_under_its_shipped_descriptor_limit(
    tmp_path: Path, replicas: list[int]
) -> None:
    """``haproxy -c`` passes a maxconn that the descriptor limit cannot hold;
    starting it for real does not: it serves on loopback under the limit
    haproxy-limits.conf ships, through both replicas."""
    port = _free_port()
    config = tmp_path / "haproxy.cfg"
    config.write_text(_on_loopback((SYSTEMD / "haproxy.cfg").read_text(), port, replicas))
    proc = _start(config, _shipped_nofile())
    try:
        seen: set[str] = set()
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=10) as client:
            for _ in range(600):  # until both replicas passed their health checks
                if proc.poll() is not None:
                    break
                try:
                    r = client.get("/healthz")
                except httpx.TransportError:
                    time.sleep(0.05)
                    continue
                if r.status_code == 200:
                    seen.add(r.text)
                    if len(seen) == 2:
                        break
                else:
                    time.sleep(0.05)
        assert proc.poll() is None, proc.communicate()[0]
        assert seen == {p.to_bytes(2, "big").hex() for p in replicas}
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        assert proc.stdout is not None
        proc.stdout.close()


def test_haproxy_refuses_to_start_when_maxconn_outgrows_the_limit(
    tmp_path: Path, replicas: list[int]
) -> None:
    """The test above can fail: 20000 connections need ~40,000 descriptors."""
    port = _free_port()
    config = tmp_path / "haproxy.cfg"
    text = _on_loopback((SYSTEMD / "haproxy.cfg").read_text(), port, replicas)
    config.write_text(re.sub(r"maxconn \d+", "maxconn 20000", text))
    proc = _start(config, _shipped_nofile())
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode != 0
    assert "Cannot raise FD limit" in out
