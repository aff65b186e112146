"""The sandbox section for real: packages from Debian's mirror and PyPI, built
once into a layer, reused, env and setup applied, failures reported."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from podbay.testing.platform import PlatformServer

pytestmark = pytest.mark.root

SPEC = """\
name: env-agent
sandbox:
  toolchain: never
  packages: [tree]
  python:
    packages: [six==1.16.0]
  env:
    GREETING: hello
  setup:
    - echo "$GREETING from setup" > /workspace/setup.txt
    - mkdir -p /workspace/src && pwd > /workspace/src/where
"""

BUILD_TIMEOUT_S = 600


def attach_until_ready(
    server: PlatformServer, token: str, name: str
) -> tuple[httpx.Response, list[httpx.Response]]:
    """PUT until the answer is not 202; returns the last answer and the 202s.

    Says it handles 202 itself (``Prefer: respond-async``), so the server
    answers at once instead of holding the request while a layer builds."""
    waits: list[httpx.Response] = []
    deadline = time.monotonic() + BUILD_TIMEOUT_S
    while time.monotonic() < deadline:
        response = server.attach(token, name, headers={"Prefer": "respond-async"})
        if response.status_code != 202:
            return response, waits
        waits.append(response)
        time.sleep(min(float(response.headers["retry-after"]), 1.0))
    raise TimeoutError(f"still 202 after {BUILD_TIMEOUT_S} s:\n{server.log_tail()}")


def run(server: PlatformServer, handle: dict[str, Any], *argv: str) -> dict[str, Any]:
    response = server.exec(handle, *argv)
    assert response.status_code == 200, response.text
    return response.json()


def layers(server: PlatformServer) -> list[Path]:
    root = server.data_dir / "layers"
    return sorted(p for p in root.iterdir() if not p.name.startswith(".")) if root.exists() else []


def test_packages_env_and_setup_are_installed_once_and_reused(server: PlatformServer) -> None:
    token = server.create_deployment("env-agent", SPEC)

    first, waits = attach_until_ready(server, token, "first")
    assert first.status_code == 200, first.text
    # The layer had to be built: the client was told to come back.
    assert waits, "the first attach of a new declaration should answer 202 while it builds"
    assert all(w.json()["name"] == "first" and w.json()["state"] == "creating" for w in waits)
    # Beyond the contract's two fields: where the build stands (test_environment_progress.py).
    assert all(set(w.json()) == {"name", "state", "progress"} for w in waits)
    assert all(int(w.headers["retry-after"]) >= 1 for w in waits)
    handle = first.json()

    assert run(server, handle, "tree", "--version")["exit_code"] == 0
    out = run(server, handle, "python3", "-c", "import six; print(six.__version__)")
    assert out["stdout"].strip() == "1.16.0", out
    assert run(server, handle, "sh", "-c", "echo $GREETING")["stdout"] == "hello\n"
    setup = run(server, handle, "cat", "/workspace/setup.txt", "/workspace/src/where")
    assert setup["stdout"] == "hello from setup\n/workspace\n"

    built = layers(server)
    assert len(built) == 1
    info = json.loads((built[0] / "layer.json").read_text())

    # A second sandbox, and a second deployment with the same declaration:
    # no 202, no rebuild, setup run again in each fresh sandbox.
    other = server.create_deployment("env-agent-2", SPEC)
    for tok, name in ((token, "second"), (other, "third")):
        response, waits = attach_until_ready(server, tok, name)
        assert response.status_code == 200, response.text
        assert not waits, response.text
        h = response.json()
        assert run(server, h, "cat", "/workspace/setup.txt")["stdout"] == "hello from setup\n"
        assert run(server, h, "python3", "-c", "import six")["exit_code"] == 0
    assert layers(server) == built
    assert json.loads((built[0] / "layer.json").read_text()) == info

    # After a reclaim (delete), the next attach is fresh: empty workspace, setup again.
    run(server, handle, "touch", "/workspace/left-behind")
    assert server.api("DELETE", "/api/v1/sandboxes/first", token).status_code == 204
    again, waits = attach_until_ready(server, token, "first")
    assert again.status_code == 200
    assert not waits
    listing = run(server, again.json(), "ls", "/workspace")["stdout"].split()
    assert listing == ["setup.txt", "src"]


def test_a_package_that_does_not_exist_fails_with_the_step_then_a_fix_builds(
    server: PlatformServer,
) -> None:
    bad = "name: broken\nsandbox:\n  toolchain: never\n  packages: [podbay-no-such-package]\n"
    token = server.create_deployment("broken", bad)
    response, _ = attach_until_ready(server, token, "b1")
    assert response.status_code == 409, response.text
    body = response.json()
    assert body["code"] == "SANDBOX_PREPARE_FAILED"
    assert "install system packages" in body["error"]
    assert "podbay-no-such-package" in body["error"]  # apt's own words, from the output
    assert server.api("GET", "/api/v1/sandboxes/b1", token).status_code == 404

    fixed = "name: broken\nsandbox:\n  toolchain: never\n  packages: [tree]\n"
    server.cli("deployment", "update", "broken", "--spec", "-", input=fixed)
    response, _ = attach_until_ready(server, token, "b1")
    assert response.status_code == 200, response.text
    assert run(server, response.json(), "tree", "--version")["exit_code"] == 0


def test_a_failing_setup_command_is_named_with_its_output(server: PlatformServer) -> None:
    spec = (
        "name: setup-fails\nsandbox:\n  toolchain: never\n  setup:\n"
        "    - echo fine\n    - echo 'the reason' >&2; exit 3\n"
    )
    token = server.create_deployment("setup-fails", spec)
    response, _ = attach_until_ready(server, token, "s1")
    assert response.status_code == 409, response.text
    body = response.json()
    assert body["code"] == "SANDBOX_APPLY_FAILED"
    assert "setup[1]" in body["error"]
    assert "exit 3" in body["error"]
    assert "the reason" in body["error"]
    # Nothing half-made stays behind.
    assert server.api("GET", "/api/v1/sandboxes/s1", token).status_code == 404


def test_an_invalid_section_is_refused_at_registration(server: PlatformServer) -> None:
    bad = (
        "name: x\nsandbox:\n  toolchain: auto\n  python:\n    packages: [ok, 'pandas && curl x']\n"
    )
    result = server.cli("deployment", "create", "invalid", "--spec", "-", input=bad, check=False)
    assert result.returncode != 0
    assert "sandbox.python.packages[1]" in result.stderr
    assert "Traceback" not in result.stderr


def test_the_sdk_waits_through_202_and_gives_up_at_its_prepare_timeout(
    server: PlatformServer,
) -> None:
    from podbay import AsyncSandboxClient, SandboxClient, SandboxPreparingError

    spec = "name: sdk-env\nsandbox:\n  toolchain: never\n  packages: [bc]\n"
    token = server.create_deployment("sdk-env", spec)

    async def attach_impatiently() -> SandboxPreparingError:
        # The async face here and the sync face below: both meet real 202s.
        async with AsyncSandboxClient(
            identity_token=token, server_url=server.base_url, prepare_timeout_seconds=0.5
        ) as impatient:
            with pytest.raises(SandboxPreparingError) as info:
                await impatient.attach("w1")
            return info.value

    assert asyncio.run(attach_impatiently()).retry_after >= 1
    with SandboxClient(identity_token=token, server_url=server.base_url) as client:
        started = time.monotonic()
        handle = client.attach("w1")  # 202s until the layer is built, then 200
        assert handle.state == "running"
        assert time.monotonic() - started > 0.2
        assert client.exec("w1", ["sh", "-c", "echo 6*7 | bc"]).stdout == "42\n"


def test_node_of_the_declared_major_with_global_packages(server: PlatformServer) -> None:
    spec = (
        'name: node-env\nsandbox:\n  toolchain: never\n  node:\n    version: "22"\n'
        "    packages: [semver@7, left-pad]\n"
    )
    token = server.create_deployment("node-env", spec)
    response, _ = attach_until_ready(server, token, "n1")
    assert response.status_code == 200, response.text
    handle = response.json()
    assert run(server, handle, "node", "--version")["stdout"].startswith("v22.")
    assert run(server, handle, "semver", "-r", ">=1.0.0", "1.2.3")["stdout"] == "1.2.3\n"
    out = run(server, handle, "node", "-e", "console.log(require('left-pad')('x', 3))")
    assert out["stdout"] == "  x\n", out
