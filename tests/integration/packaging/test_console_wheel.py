"""The wheel carries the built web console, so ``pip install 'podbay[server]'``
serves it without node (pyproject's ``artifacts``, hatch_build.py)."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_the_wheel_carries_the_built_console(tmp_path: Path) -> None:
    assert (ROOT / "src/podbay/console/static/index.html").is_file(), "./run builds it"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(ROOT)],
        check=True,
        capture_output=True,
        timeout=600,
    )
    (wheel,) = tmp_path.glob("podbay-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for built in ("index.html", "assets/main.js", "assets/main.css"):
        assert f"podbay/console/static/{built}" in names
