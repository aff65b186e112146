"""The README's configuration table names every setting there is."""

from __future__ import annotations

import dataclasses
import re
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


def sh_snippets() -> list[str]:
    return re.findall(r"```sh\n(.*?)```", README.read_text(), re.S)


def test_every_file_a_cli_snippet_copies_is_made_in_it() -> None:
    # A newcomer runs a snippet as printed: a `podbay sandbox cp ./x ...` of a
    # file the snippet never made fails on the first try.
    for snippet in sh_snippets():
        lines = snippet.splitlines()
        for i, line in enumerate(lines):
            copied = re.match(r"podbay sandbox cp (\./[^\s:]+) ", line)
            if copied:
                made = copied.group(1)
                before = "\n".join(lines[:i])
                assert re.search(rf">\s*(\./)?{re.escape(made[2:])}\b", before), (
                    f"README: {line!r} copies {made}, which the snippet never makes"
                )
