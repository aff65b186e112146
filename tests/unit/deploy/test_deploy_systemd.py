"""deploy/systemd: the unit files pass ``systemd-analyze verify`` without a
word of complaint, the load balancer's example passes ``haproxy -c``, and the
environment files name the settings the units' roles read."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

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
    assert result.returncode == 0 and result.stderr == "", result.stderr


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
        assert both in control and both in node
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
