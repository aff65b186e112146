"""The import contract of pyproject.toml ([tool.importlinter], drawn in
ARCHITECTURE.md) holds for the tree, and fails on an import that breaks it:
each case plants one import into a copy of the package and runs the same
``lint-imports`` that ``./run test`` runs."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def _lint(tree: Path) -> subprocess.CompletedProcess[str]:
    # The copy comes first on the path, so the contract is checked against it
    # and not against the installed (editable) package.
    env = {**os.environ, "PYTHONPATH": str(tree)}
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", "--no-logo"],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    shutil.copytree(
        ROOT / "src" / "podbay", tmp_path / "podbay", ignore=shutil.ignore_patterns("__pycache__")
    )
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def test_the_tree_keeps_the_contract(tree: Path) -> None:
    result = _lint(tree)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


@pytest.mark.parametrize(
    ("module", "planted", "broken"),
    [
        # A plane reaching into a peer plane.
        ("control/nodes.py", "import podbay.node.pool", "podbay.control is not allowed to import"),
        ("node/local.py", "import podbay.gateway.app", "podbay.node is not allowed to import"),
        # What both planes share reaching up into one of them.
        ("dataplane/orders.py", "import podbay.control.nodes", "podbay.dataplane is not allowed"),
        # A plane reaching up into the composition root, or e2b above it.
        ("control/keys.py", "import podbay.serve.build", "podbay.control is not allowed"),
        ("gateway/app.py", "import podbay.e2b.keys", "podbay.gateway is not allowed"),
        # The environment builder implements the seam; it never calls the control plane.
        ("environment/spec.py", "import podbay.control.keys", "podbay.environment is not allowed"),
        # Fixtures start servers as a user does, never by building one in process.
        ("testing/platform.py", "import podbay.serve.build", "podbay.testing is not allowed"),
        # The SDK stands on the wire contract alone.
        ("client/_models.py", "import podbay.store.base", "podbay.client is not allowed"),
        # An import made for the type checker alone is an import all the same.
        (
            "node/shutdown.py",
            "import typing\nif typing.TYPE_CHECKING:\n    import podbay.control.plane",
            "podbay.node is not allowed to import podbay.control",
        ),
        # A circle inside a package (the node's server and its internal API's
        # routes were one), made under TYPE_CHECKING as that one was.
        (
            "node/control_calls.py",
            "import typing\nif typing.TYPE_CHECKING:\n    import podbay.node.server",
            "No cycles are allowed in podbay.node",
        ),
        ("wire/paths.py", "import podbay.wire.openapi", "No cycles are allowed in podbay.wire"),
    ],
)
def test_a_planted_import_breaks_the_contract(
    tree: Path, module: str, planted: str, broken: str
) -> None:
    path = tree / "podbay" / module
    path.write_text(path.read_text() + "\n" + planted + "\n")
    result = _lint(tree)
    assert result.returncode != 0
    assert "BROKEN" in result.stdout, result.stdout
    assert broken in result.stdout, result.stdout
