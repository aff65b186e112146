from __future__ import annotations

import shutil
from pathlib import Path

from podbay.runtime.hostdisk import reserve_shortfall


def test_reserve_shortfall(tmp_path: Path) -> None:
    free = shutil.disk_usage(tmp_path).free
    assert reserve_shortfall(tmp_path, 0) is None
    assert reserve_shortfall(tmp_path / "not" / "yet", 1) is None  # nearest existing parent
    short = reserve_shortfall(tmp_path, free + 1024**4)
    assert short is not None
    assert "runtime.disk_reserve_bytes" in short
