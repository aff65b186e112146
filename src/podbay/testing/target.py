"""What a benchmark measures: a server it is told of, or a fresh local one.

Every ``bench/*.py`` that talks to a platform takes ``--server URL --token T``
(a running deployment) or, without them, starts a real ``podbay serve`` of its
own for the run; ``--json`` prints the figures as one document.
"""

from __future__ import annotations

import argparse
import contextlib
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path


def bench_arguments(description: str) -> argparse.ArgumentParser:
    """A parser with the options every platform benchmark has."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--server", help="a running server's URL (with --token)")
    parser.add_argument("--token", help="an identity token of that server")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    return parser


@dataclass(frozen=True)
class Target:
    url: str
    token: str
    #: What is measured, for the report's first line.
    description: str


@contextlib.contextmanager
def bench_target(server: str | None, token: str | None, local: str) -> Iterator[Target]:
    """The server named by ``server`` and ``token``, else a local ``podbay serve``
    (described as ``local``) with a deployment "bench", closed afterwards."""
    if server and token:
        yield Target(server, token, f"server at {server}")
        return
    from podbay.testing.platform import PlatformServer

    with PlatformServer.start(Path(tempfile.mkdtemp(prefix="podbay-bench-"))) as started:
        yield Target(started.base_url, started.create_deployment("bench"), local)
