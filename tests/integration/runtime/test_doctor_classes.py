"""``podbay doctor`` per sandbox class: each enabled class checked and probed,
the ones that cannot run named with why, and what ``default`` means."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from podbay.runtime.probes import BYPASSES
from podbay.testing.fixtures import cleanup, require_host, sandbox_settings

pytestmark = pytest.mark.root


def doctor(tmp_path: Path, **env: str) -> tuple[int, dict[str, Any]]:
    """``podbay doctor --json`` on a fresh data directory with ``env`` added."""
    require_host()
    settings = sandbox_settings(tmp_path / "d")
    environ = {
        **os.environ,
        "PODBAY_RUNTIME_IMAGE_DIR": settings.runtime.image_dir,
        "PODBAY_RUNTIME_RUN_DIR": settings.runtime.run_dir,
        **env,
    }
    argv = [sys.executable, "-m", "podbay.cli.main", "doctor"]
    try:
        done = subprocess.run(
            [*argv, "--data-dir", str(settings.data_dir), "--json"],
            env=environ,
            capture_output=True,
            text=True,
            timeout=600,
        )
    finally:
        cleanup(settings)
    return done.returncode, json.loads(done.stdout)


def assert_egress_bypasses_held(report: dict[str, Any], name: str) -> None:
    """Each bypass probe of the egress policy ran for class ``name`` and held,
    with its decoy answering where allowed (so the probes proved something)."""
    checks = {c["name"]: c for c in report["checks"]}
    expected = [f"{name}: egress policy probes reach their decoy where allowed"]
    expected += [f"{name}: egress policy holds: {what}" for what in BYPASSES.values()]
    for check in expected:
        assert check in checks, (check, sorted(checks))
        assert checks[check]["ok"], checks[check]


def test_doctor_reports_each_class_and_what_default_means(tmp_path: Path) -> None:
    returncode, report = doctor(
        tmp_path,
        PODBAY_RUNTIME_CLASSES="gvisor,container",
        # gVisor made unavailable on purpose: the report must say why, and
        # default must fall back to what works.
        PODBAY_RUNTIME_GVISOR_RUNTIME="/nonexistent/runsc",
    )
    assert returncode == 1
    assert not report["ok"]
    checks = {c["name"]: c for c in report["checks"]}
    assert not checks["gvisor: host check"]["ok"]
    assert "apt-get install runsc" in checks["gvisor: host check"]["detail"]
    container = [c for name, c in checks.items() if name.startswith("container: ")]
    assert len(container) > 10, container
    assert all(c["ok"] for c in container), container
    assert "container: outbound internet" in checks
    assert "container: destroy leaves nothing" in checks
    assert_egress_bypasses_held(report, "container")
    assert report["enabled"] == ["gvisor", "container"]
    assert report["working"] == ["container"]
    assert "not found" in report["why_not"]["gvisor"]
    assert report["default"] == "container"
    assert report["timing"]["container"].startswith("create-to-ready ")
    # Only what failed made the run fail.
    assert [c["name"] for c in report["checks"] if not c["ok"]] == ["gvisor: host check"]


def test_doctor_passes_every_gvisor_probe(tmp_path: Path) -> None:
    """gVisor's probes with the sandboxes' own limits: at a smaller pids limit
    than theirs, the sandbox ended during the network probe (gVisor's kernel
    threads count against it) and every later probe failed."""
    returncode, report = doctor(tmp_path, PODBAY_RUNTIME_CLASSES="gvisor")
    failed = [c for c in report["checks"] if not c["ok"]]
    assert returncode == 0, failed
    assert report["ok"], failed
    assert not failed, failed
    names = [c["name"] for c in report["checks"]]
    assert "gvisor: no path to the host, private ranges or metadata" in names
    assert "gvisor: fork bomb contained" in names
    assert_egress_bypasses_held(report, "gvisor")
    assert report["working"] == ["gvisor"]
    assert report["default"] == "gvisor"
