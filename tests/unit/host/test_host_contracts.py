"""The host/runtime/agent import contracts (pyproject.toml, checked by
``lint-imports`` in ./run test) hold on the tree, and fail on a planted import
that breaks each: the layering cannot rot unseen."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def lint(tree: Path) -> subprocess.CompletedProcess[str]:
    """lint-imports on the copy of the project at ``tree``, its contracts only."""
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", "--no-logo", "--config", str(tree / "pyproject.toml")],
        cwd=tree,
        env={"PYTHONPATH": str(tree / "src"), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=False,
    )


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    copy = tmp_path_factory.mktemp("tree")
    shutil.copy(ROOT / "pyproject.toml", copy)
    shutil.copytree(
        ROOT / "src", copy / "src", ignore=shutil.ignore_patterns("__pycache__", "_native")
    )
    return copy


def test_the_tree_keeps_every_contract(tree: Path) -> None:
    done = lint(tree)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "host/runtime/agent" in done.stdout


@pytest.mark.parametrize(
    ("module", "planted", "broken"),
    [
        ("host/records.py", "import podbay.runtime.base", "the host library imports nothing"),
        ("runtime/oci/bundle.py", "import podbay.agent.launch", "only through its protocol"),
        ("agent/ring.py", "import podbay.host.tools", "the agent (the in-sandbox program)"),
        ("runtime/oci/runsc.py", "import podbay.runtime.native_build", "never runs a compiler"),
        ("runtime/base.py", "import podbay.control", "import nothing of the planes"),
        ("host/tools.py", "import podbay.testing", "import nothing of the planes"),
        ("runtime/tools_circle.py", "import podbay.runtime.machines", "no circle"),
    ],
)
def test_a_planted_import_breaks_its_contract(
    tree: Path, module: str, planted: str, broken: str
) -> None:
    path = tree / "src" / "podbay" / module
    kept = path.read_text() if path.exists() else None
    if module == "runtime/tools_circle.py":  # a circle: machines -> tools_circle -> machines
        machines = tree / "src/podbay/runtime/machines.py"
        original = machines.read_text()
        machines.write_text(original + "\nfrom . import tools_circle  # noqa\n")
    try:
        path.write_text((kept or "") + f"\n{planted}  # planted\n")
        done = lint(tree)
    finally:
        if kept is None:
            path.unlink()
        else:
            path.write_text(kept)
        if module == "runtime/tools_circle.py":
            machines.write_text(original)
    assert done.returncode != 0
    assert "BROKEN" in done.stdout, done.stdout
    assert broken in done.stdout.replace("\n", " "), done.stdout
