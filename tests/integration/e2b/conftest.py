"""What the E2B test modules share: a real ``podbay serve`` per class (default
and ``container``), a key ``podbay deployment create --e2b-key`` printed, and
the SDK's options pointing at that server.

``vm`` (QEMU under TCG) runs a representative subset (commands, files,
terminals, lifecycle, the JS SDK's commands and files): a test opts in with
``pytest.mark.parametrize("e2b_server", [*CLASSES, "vm"], indirect=True)``,
and every such test of every module shares one ``vm`` server (its start and
first machine are the cost), so each module names its own deployments."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from podbay.testing.fixtures import shared_layer_dir
from podbay.testing.platform import PlatformServer, e2b_key

#: The classes every E2B test runs on; ``vm`` is added test by test (above).
CLASSES = ["gvisor", "container"]
WITH_VM = [*CLASSES, "vm"]


def _serve(tmp_path_factory: pytest.TempPathFactory, class_: str) -> PlatformServer:
    return PlatformServer.start(
        tmp_path_factory.mktemp(f"e2b-{class_}"),
        # code-interpreter-v1's layer is built once per machine, not per run.
        env={"PODBAY_RUNTIME_CLASSES": class_, "PODBAY_RUNTIME_LAYER_DIR": shared_layer_dir()},
    )


@pytest.fixture(scope="session")
def e2b_vm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PlatformServer]:
    """The one ``vm`` server of the session (see the module's docstring)."""
    with _serve(tmp_path_factory, "vm") as s:
        yield s


@pytest.fixture(scope="module", params=CLASSES)
def e2b_server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[PlatformServer]:
    if request.param == "vm":
        yield request.getfixturevalue("e2b_vm_server")
        return
    with _serve(tmp_path_factory, request.param) as s:
        yield s


def module_deployment(request: pytest.FixtureRequest, prefix: str = "e2b") -> str:
    """A deployment name of this module's own: the ``vm`` server is shared by
    every module, and a name is created once per server."""
    return f"{prefix}-{request.module.__name__.rsplit('.', 1)[-1].removeprefix('test_e2b_')}"


@pytest.fixture(scope="module")
def e2b_opts(request: pytest.FixtureRequest, e2b_server: PlatformServer) -> dict[str, Any]:
    """The SDK's connection options for one deployment of ``e2b_server``."""
    key = e2b_key(e2b_server, module_deployment(request, "e2b-shared"))
    return {"api_key": key, "api_url": e2b_server.base_url, "sandbox_url": e2b_server.base_url}
