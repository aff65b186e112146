"""E2B's JavaScript SDK (npm ``e2b``, pinned in ``js/package-lock.json``) against a
real ``podbay serve``, unchanged: each test runs a node scenario in ``js/`` that
reaches podbay through ``E2B_API_URL``, ``E2B_SANDBOX_URL`` and a key
``podbay deployment create --e2b-key`` printed, and prints what it observed as
one JSON line, which the test checks. One server per class (``conftest.py``)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from podbay.testing.node_packages import installed_node_packages
from podbay.testing.platform import PlatformServer, e2b_key

pytestmark = pytest.mark.root

#: The scenarios and the package that pins the SDK.
SCENARIOS = Path(__file__).parent / "js"


@pytest.fixture(scope="session")
def scenarios(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The scenarios beside the pinned SDK: ``npm ci`` once per lock file into a
    cache outside the repository, then a copy of the scripts with a link to it."""
    node_modules = installed_node_packages(SCENARIOS)
    here = tmp_path_factory.mktemp("e2b-js")
    for script in SCENARIOS.glob("*.mjs"):
        (here / script.name).write_bytes(script.read_bytes())
    (here / "node_modules").symlink_to(node_modules, target_is_directory=True)
    return here


@pytest.fixture(scope="module")
def key(e2b_server: PlatformServer) -> str:
    return e2b_key(e2b_server, "e2b-js")


def run_scenario(
    scenarios: Path, name: str, server: PlatformServer, key: str, *args: str
) -> dict[str, Any]:
    """What the scenario ``name`` observed; a scenario that fails shows its error."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("E2B_")}
    env |= {"E2B_API_URL": server.base_url, "E2B_SANDBOX_URL": server.base_url, "E2B_API_KEY": key}
    ran = subprocess.run(
        ["node", str(scenarios / f"{name}.mjs"), *args],
        env=env,
        cwd=scenarios,
        capture_output=True,
        text=True,
        check=False,
    )
    assert ran.returncode == 0, f"{name}.mjs failed:\n{ran.stderr}\n{ran.stdout}"
    observed: dict[str, Any] = json.loads(ran.stdout.strip().splitlines()[-1])
    return observed


@pytest.mark.parametrize("e2b_server", ["gvisor", "container", "vm"], indirect=True)
def test_js_commands(scenarios: Path, e2b_server: PlatformServer, key: str) -> None:
    seen = run_scenario(scenarios, "commands", e2b_server, key)
    assert seen["run"] == {"stdout": "out\n", "stderr": "err\n", "exitCode": 0}
    assert seen["envs"] == "hello-y\n"  # create's envs under the call's
    assert seen["home"] == "/home/user\nuser\n"
    assert seen["cwdRoot"] == "/tmp\nroot\n"
    assert seen["callbacks"] == {"streamed": [["out", "a\n"], ["err", "b\n"]], "stdout": "a\n"}
    assert seen["exit3"] == {
        "name": "CommandExitError",
        "sandboxError": True,
        "message": "",
        "exitCode": 3,
        "stderr": "oops\n",
    }
    assert (seen["listed"], seen["killed"], seen["listedAfterKill"], seen["killAgain"]) == (
        True,
        True,
        False,
        False,
    )
    # As podbay's Python SDK test: a SIGKILLed command ends with 137.
    assert (seen["killedWait"]["name"], seen["killedWait"]["exitCode"]) == ("CommandExitError", 137)
    assert seen["supportsStdinClose"] is True
    # stdin closed: cat ends with 0, for its first follower and for connect's.
    assert seen["cat"] == {"stdout": "typed\nagain\n", "ended": None, "followerWait": None}


@pytest.mark.parametrize("e2b_server", ["gvisor", "container", "vm"], indirect=True)
def test_js_files(scenarios: Path, e2b_server: PlatformServer, key: str) -> None:
    seen = run_scenario(scenarios, "files", e2b_server, key)
    assert seen["written"] == {"path": "/tmp/js/a.txt", "name": "a.txt"}
    assert seen["readText"] == seen["catText"] == "written by js\n"
    assert seen["readBytes"] == [0, 255, 98, 121, 116, 101, 115]
    assert seen["relative"] == "/home/user/rel.txt"
    assert seen["several"] == ["/tmp/js/many/1.txt", "/tmp/js/many/2.txt"]
    assert seen["list"] == [["a.txt", "file"], ["b.bin", "file"], ["many", "dir"]]
    assert seen["listDeep"] == [
        "/tmp/js/a.txt",
        "/tmp/js/b.bin",
        "/tmp/js/many",
        "/tmp/js/many/1.txt",
        "/tmp/js/many/2.txt",
    ]
    assert seen["makeDir"] == [True, False]
    assert seen["info"] == {"name": "a.txt", "type": "file", "size": 14, "isFile": True}
    assert seen["exists"] == [True, False]
    assert seen["renamed"] == "/tmp/js/c.txt"
    assert seen["afterRemove"] == ["b.bin", "c.txt", "d"]
    assert seen["watched"][0] == "create"
    for missing in ("readMissing", "infoMissing", "watchMissing"):
        assert seen[missing]["name"] == "FileNotFoundError", seen[missing]
    assert seen["writeRootAsUser"]["name"] == "SandboxError"
    assert "Permission denied" in seen["writeRootAsUser"]["message"]


def test_js_pty(scenarios: Path, e2b_server: PlatformServer, key: str) -> None:
    seen = run_scenario(scenarios, "pty", e2b_server, key)
    assert (seen["listed"], seen["line"], seen["resized"]) == (True, True, True)
    for ended in (seen["exit"], seen["followerExit"]):  # `exit 3` in the shell
        assert (ended["name"], ended["exitCode"]) == ("CommandExitError", 3)
    assert seen["kill"] is True
    assert (seen["killedWait"]["name"], seen["killedWait"]["exitCode"]) == ("CommandExitError", -1)


def test_js_lifecycle(scenarios: Path, e2b_server: PlatformServer, key: str) -> None:
    seen = run_scenario(scenarios, "lifecycle", e2b_server, key)
    sandbox_id = seen["sandboxId"]
    assert seen["info"] == {
        "templateId": "base",
        "metadata": {"suite": seen["info"]["metadata"]["suite"]},
        "state": "running",
    }
    assert seen["initialSeconds"] == 120
    assert seen["extendedSeconds"] >= 599
    assert (seen["listed"], seen["listedOther"]) == ([sandbox_id], 0)
    assert seen["host"] == f"8080-{sandbox_id}.localhost:{e2b_server.base_url.rsplit(':', 1)[1]}"
    assert seen["served"] == {"status": 200, "body": "served\n"}
    assert seen["servedWithoutToken"] == 401
    assert seen["pause"] is True
    # isRunning asks envd's /health, which a paused podbay sandbox answers (its
    # traffic resumes it: auto-resume is always on), as test_e2b_lifecycle's.
    assert seen["runningWhilePaused"] is True
    assert seen["listedPaused"] == [[sandbox_id, "paused"]]
    assert (seen["resumedRunning"], seen["afterResume"]) == (True, "served\n")
    assert (seen["kill"], seen["runningAfterKill"], seen["killAgain"]) == (True, False, False)
    for after_kill in ("runAfterKill", "connectAfterKill", "infoAfterKill"):
        assert seen[after_kill]["name"] == "SandboxNotFoundError", seen[after_kill]
    # podbay's own API agrees: the sandbox is gone.
    assert (
        e2b_server.http.get(f"/sandboxes/{sandbox_id}", headers={"X-API-Key": key}).status_code
        == 404
    )


def test_js_errors(scenarios: Path, e2b_server: PlatformServer, key: str) -> None:
    seen = run_scenario(scenarios, "errors", e2b_server, key)
    for refused in (seen["wrongKey"], seen["listWrongKey"]):
        assert refused["name"] == "AuthenticationError", refused
        assert "invalid API key" in refused["message"]
    assert seen["unknownTemplate"]["name"] == "SandboxError"
    assert seen["unknownTemplate"]["message"].startswith("404: template 'no-such-template'")


def test_js_code_interpreter(scenarios: Path, e2b_server: PlatformServer, key: str) -> None:
    seen = run_scenario(scenarios, "interpreter", e2b_server, key)
    assert seen["cell"] == {
        "text": "42",
        "stdout": ["line\n"],
        "streamed": ["line\n"],
        "count": True,
    }
    assert seen["error"] == {"name": "ZeroDivisionError", "value": "division by zero"}
    assert seen["bash"] == ["42\n"]
    assert (seen["contextCwd"], seen["contextOwnState"]) == ("'/tmp'", "False")
    assert (seen["contexts"], seen["contextsAfterRemove"]) == (True, False)


def test_js_client_class_and_extras(scenarios: Path, e2b_server: PlatformServer, key: str) -> None:
    seen = run_scenario(scenarios, "extras", e2b_server, key, "e2b-js")
    first, second = seen["ids"]
    assert seen["list"] == {
        "default": [second, first],  # newest first, as E2B's API
        "asc": [first, second],
        "base": [first],
        "own": [second],
        "startedAfter": [second],
    }
    assert seen["gzip"] is True
    assert seen["bodies"] == ["from a blob", "from a stream"]
    # Signed URLs as the SDK hands them out, fetched without any header.
    assert (seen["upload"], seen["uploaded"]) == (200, "uploaded by url")
    assert seen["download"] == {"status": 200, "body": "uploaded by url"}
    assert seen["tampered"] == 401  # a signature names its path
    assert seen["commandTimeout"]["name"] == "TimeoutError"
    assert seen["metrics"] == {
        "timestamp": True,
        "cpuCount": True,
        "memTotal": True,
        "diskTotal": True,
    }
