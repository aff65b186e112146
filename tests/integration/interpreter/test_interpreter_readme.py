"""The README's code interpreter section, as printed: the declaration it gives
brings matplotlib, numpy and pandas (the base image has none of them), and a
plot comes back as a PNG."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from podbay.client import SandboxClient
from podbay.testing.platform import PlatformServer

pytestmark = pytest.mark.root

README = Path(__file__).resolve().parents[3] / "README.md"


def declaration() -> str:
    """The yaml block of the README's "Code interpreter" section."""
    section = README.read_text().split("### Code interpreter", 1)[1].split("\n### ", 1)[0]
    found = re.search(r"```yaml\n(.*?)```", section, re.DOTALL)
    assert found, "the README's interpreter section declares no environment"
    return found.group(1)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PlatformServer]:
    with PlatformServer.start(tmp_path_factory.mktemp("interpreter-readme")) as s:
        yield s


def test_the_base_image_has_no_matplotlib(server: PlatformServer) -> None:
    token = server.create_deployment("plain", "name: plain\nsandbox:\n  toolchain: never\n")
    with SandboxClient(identity_token=token, server_url=server.base_url) as client:
        missing = client.run_code("bare", "import matplotlib")
        assert missing.error is not None
        assert missing.error.name == "ModuleNotFoundError"


def test_the_readme_declaration_gives_a_png(server: PlatformServer) -> None:
    token = server.create_deployment("plots", "name: plots\n" + declaration())
    with SandboxClient(
        identity_token=token, server_url=server.base_url, prepare_timeout_seconds=1800
    ) as client:
        plot = client.run_code(
            "plots", "import matplotlib.pyplot as plt; plt.plot([1, 4, 9])", timeout_ms=120_000
        )
        assert plot.error is None, plot.error
        pngs = [r.png for r in plot.results if r.png is not None]
        assert len(pngs) == 1
        assert pngs[0].startswith(b"\x89PNG\r\n\x1a\n")
        frame = client.run_code(
            "plots", "import pandas as pd, numpy as np\npd.DataFrame(np.eye(2))"
        )
        html = frame.result.html if frame.result is not None else None
        assert frame.error is None
        assert html is not None
        assert "<table" in html
