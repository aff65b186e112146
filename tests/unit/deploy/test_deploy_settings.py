"""Every ``PODBAY_*`` variable the deployment files and docs/cluster.md set is
a setting podbay reads (a misspelt one would be silently ignored)."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

from podbay.settings import Settings

ROOT = Path(__file__).resolve().parents[3]


def variables(obj: Any, prefix: str = "PODBAY") -> set[str]:
    names: set[str] = set()
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        name = f"{prefix}_{f.name.upper()}"
        names |= variables(value, name) if dataclasses.is_dataclass(value) else {name}
    return names


def test_deployment_files_set_only_real_settings() -> None:
    files = [
        *(ROOT / "deploy" / "kubernetes").glob("*.yaml"),
        *(ROOT / "deploy" / "systemd").glob("*.env"),
        ROOT / "docs" / "cluster.md",
    ]
    used = {
        (path.name, name)
        for path in files
        for name in re.findall(r"\bPODBAY_[A-Z0-9_]*[A-Z0-9]", path.read_text())
    }
    assert len({name for _, name in used}) >= 8
    known = variables(Settings.load(environ={}))
    # The test suite's own variables (a server to aim at) are no settings.
    used = {(f, n) for f, n in used if not n.startswith("PODBAY_TEST_")}
    unknown = sorted((f, n) for f, n in used if n not in known)
    assert not unknown, f"not settings: {unknown}"
