"""deepagents' standard sandbox suite, side by side: podbay and deepagents' own backend.

    sudo .venv/bin/python scripts/deepagents_suite.py

runs ``langchain-tests``' ``SandboxIntegrationTests`` twice at the installed
(pinned) versions and prints passed/failed/skipped for each, the tests that
fail on each side and those failing on both:

- podbay: ``TestPodbaySandboxStandard`` in
  ``tests/integration/integrations/test_deepagents.py`` (a real
  ``podbay serve`` and sandbox; needs root, as the suite does);
- deepagents' reference: this file's :class:`TestLocalShellReferenceStandard`,
  the suite against deepagents' ``LocalShellBackend``. deepagents' hosted
  reference (LangSmith sandboxes) needs a network and a key; the local shell
  backend is the one it ships that runs anywhere. It works on the host itself,
  so the suite's files go to a fresh temporary directory and this interpreter's
  directory leads ``PATH`` (the suite runs ``python``).

This file is not collected by ``./run test`` (the reference's own failures are
what it measures, not a regression of ours); it is collected when named.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from importlib.metadata import version
from pathlib import Path

import pytest
from deepagents.backends import LocalShellBackend
from deepagents.backends.protocol import SandboxBackendProtocol
from langchain_tests.integration_tests import SandboxIntegrationTests

REPO = Path(__file__).resolve().parent.parent
PODBAY_SUITE = "tests/integration/integrations/test_deepagents.py::TestPodbaySandboxStandard"

# The suite's async tests carry no marker of their own (langchain runs them in
# pytest-asyncio's auto mode); anyio's marker applies to them only.
pytestmark = pytest.mark.anyio


@pytest.fixture(scope="module")
def host_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("deepagents-reference")


class TestLocalShellReferenceStandard(SandboxIntegrationTests):
    @pytest.fixture(scope="class")
    @classmethod
    def sandbox(cls, host_root: Path) -> SandboxBackendProtocol:
        path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
        return LocalShellBackend(
            root_dir=host_root, virtual_mode=False, env={**os.environ, "PATH": path}
        )

    @pytest.fixture(autouse=True)
    def _host_root(self, host_root: Path) -> None:
        self.host_root = host_root

    @property
    def sandbox_root_dir(self) -> str:
        return f"{self.host_root}/ops/"


def run_suite(target: str, report: Path) -> dict[str, str]:
    """Outcome per test name ("passed", "failed", "skipped") from pytest's JUnit XML."""
    subprocess.run(
        [sys.executable, "-m", "pytest", target, "-q", "-p", "no:cacheprovider",
         f"--junitxml={report}"],
        cwd=REPO,
        env={**os.environ, "PODBAY_TEST_REQUIRE_SANDBOXES": "1"},
        check=False,
    )  # fmt: skip
    outcomes = {}
    # The report is the one pytest just wrote here.
    for case in ET.parse(report).getroot().iter("testcase"):  # noqa: S314
        name = case.get("name", "").removesuffix("[asyncio]")
        if case.find("failure") is not None or case.find("error") is not None:
            outcomes[name] = "failed"
        elif case.find("skipped") is not None:
            outcomes[name] = "skipped"
        else:
            outcomes[name] = "passed"
    return outcomes


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        sides = {
            "podbay (PodbaySandbox)": run_suite(PODBAY_SUITE, Path(tmp, "podbay.xml")),
            "deepagents LocalShellBackend": run_suite(__file__, Path(tmp, "reference.xml")),
        }
    pins = ", ".join(f"{p}=={version(p)}" for p in ("deepagents", "langchain-tests"))
    print(f"\n{pins}\n\n| backend | passed | failed | skipped |\n|---|---|---|---|")
    for side, outcomes in sides.items():
        counts = [
            sum(1 for o in outcomes.values() if o == k) for k in ("passed", "failed", "skipped")
        ]
        print(f"| {side} | {counts[0]} | {counts[1]} | {counts[2]} |")
    failing = [{n for n, o in outcomes.items() if o != "passed"} for outcomes in sides.values()]
    for side, names in zip(sides, failing, strict=True):
        print(f"\nnot passed on {side}: {', '.join(sorted(names)) or 'none'}")
    print(f"\nnot passed on both: {', '.join(sorted(failing[0] & failing[1])) or 'none'}")


if __name__ == "__main__":
    main()
