"""Every ``pip install`` line the README and docs print works with the pip that
Debian 12's ``python3 -m venv`` gives (pip 23.0.1).

pip 23 compares the extra a line asks for with the package's extras as
written, without normalising it: ``podbay[inspect_ai]`` against an extra that
the wheel's metadata spells ``inspect-ai`` found nothing and only warned. So
every extra is named as pip normalises it, and every line asks for it so.
One line is then installed for real in a virtualenv made by Debian's own
``/usr/bin/python3 -m venv``, with the pip it seeds.
"""

from __future__ import annotations

import os
import re
import subprocess
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
PIP_CACHE = os.environ.get("PODBAY_TEST_PIP_CACHE", "/var/tmp/podbay-test-pip-cache")
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
#: ``podbay[a,b]`` (or a path to this tree, as ``./run`` and the Dockerfile write it).
EXTRAS = re.compile(r"(?:podbay|\.|-src)\[([^\]]+)\]")


def normalised(name: str) -> str:
    """An extra's name as pip and the wheel's metadata spell it (PEP 685)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def declared() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return set(project["optional-dependencies"])


def install_lines() -> list[tuple[str, str]]:
    """(where, line) for every line that runs pip install on podbay with extras."""
    lines = []
    for path in [*DOCS, ROOT / "run", ROOT / "deploy" / "image" / "Dockerfile"]:
        text = path.read_text()
        # A command continued over lines (``\\``) is one line here.
        for number, line in enumerate(text.replace("\\\n", " ").splitlines(), 1):
            if "pip install" in line and EXTRAS.search(line):
                lines.append((f"{path.relative_to(ROOT)}:{number}", line))
    return lines


def test_every_extra_is_named_as_pip_normalises_it() -> None:
    assert {name for name in declared() if normalised(name) != name} == set()


def test_the_docs_print_install_lines() -> None:
    where = {place.split(":")[0] for place, _ in install_lines()}
    assert {"README.md", "docs/integrations.md", "docs/cluster.md", "run"} <= where


@pytest.mark.parametrize(("where", "line"), install_lines())
def test_every_install_line_names_extras_that_exist(where: str, line: str) -> None:
    extras = declared()
    asked = [e.strip() for match in EXTRAS.findall(line) for e in match.split(",")]
    assert asked, line
    # As written, not normalised: pip 23 looks the name up as the line spells it.
    assert [e for e in asked if e not in extras] == [], f"{where}: {line.strip()}"


def test_an_install_line_installs_its_extra_with_debians_pip(
    tmp_path: Path,
) -> None:
    line = next(line for _, line in install_lines() if "podbay[openai-agents]" in line)
    assert "pip install 'podbay[openai-agents]'" in line
    venv = tmp_path / "venv"
    env = {"PATH": "/usr/bin:/bin", "PIP_CACHE_DIR": PIP_CACHE, "HOME": "/nonexistent"}
    made = subprocess.run(
        ["/usr/bin/python3", "-m", "venv", str(venv)], capture_output=True, text=True, env=env
    )
    assert made.returncode == 0, made.stderr
    version = subprocess.run(
        [str(venv / "bin" / "pip"), "--version"], capture_output=True, text=True, env=env
    )
    assert version.stdout.startswith("pip 23."), version.stdout
    # The line as printed, with this tree for `podbay` (it is not on PyPI).
    installed = subprocess.run(
        [str(venv / "bin" / "pip"), "install", "-q", f"{ROOT}[openai-agents]"],
        capture_output=True,
        text=True,
        env=env,
        timeout=1200,
    )
    assert installed.returncode == 0, installed.stdout + installed.stderr
    assert "does not provide the extra" not in installed.stderr, installed.stderr
    imported = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import agents, podbay.integrations.openai_agents"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert imported.returncode == 0, imported.stderr
