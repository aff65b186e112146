"""The README's configuration table names every setting there is."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from podbay.settings import Settings

README = Path(__file__).resolve().parents[2] / "README.md"


def variables(obj: Any, prefix: str = "PODBAY") -> list[str]:
    names = []
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        name = f"{prefix}_{f.name.upper()}"
        names += variables(value, name) if dataclasses.is_dataclass(value) else [name]
    return names


def test_every_setting_is_in_the_configuration_table() -> None:
    table = README.read_text().split("## Configuration", 1)[1]
    missing = [v for v in variables(Settings.load(environ={})) if f"`{v}`" not in table]
    assert not missing, f"README's configuration table lacks {missing}"
