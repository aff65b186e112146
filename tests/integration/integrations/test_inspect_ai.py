"""The inspect_ai sandbox type "podbay" against a real ``podbay serve`` and real sandboxes:
inspect's own sandbox checks (its ``self_check`` module, pulled in whole), then an
``inspect eval`` run as a user would run it, with inspect's mock model calling bash."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import NamedTuple

import anyio
import pytest
from inspect_ai.log import read_eval_log
from inspect_ai.util import OutputLimitExceededError, SandboxEnvironment
from inspect_ai.util._sandbox.lifecycle import sandbox_lifecycle_scope
from inspect_ai.util._sandbox.limits import override_max_exec_output_size

# inspect's portable checks, collected here as tests driven by `sandbox_env` below.
from inspect_ai.util._sandbox.self_check import *  # noqa: F403

from podbay.client import SandboxClient, SandboxRequestError
from podbay.integrations.inspect_ai import (
    NAME_PREFIX,
    PodbaySandboxEnvironment,
    PodbaySandboxEnvironmentConfig,
)
from podbay.testing.platform import PlatformServer

pytestmark = [pytest.mark.root, pytest.mark.anyio]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PlatformServer]:
    with PlatformServer.start(
        tmp_path_factory.mktemp("serve-inspect"),
        env={"PODBAY_RUNTIME_CLASSES": "container,gvisor"},
    ) as s:
        # gVisor is proven in the background after the server is up: wait for it.
        deadline = time.monotonic() + 600
        while "gvisor" not in s.http.get("/healthz").json()["classes"]["available"]:
            assert time.monotonic() < deadline, "gvisor never became available"
            time.sleep(0.5)
        yield s


@pytest.fixture(scope="module")
def token(server: PlatformServer) -> Iterator[str]:
    """The deployment's token in ``ASTRO_AUTHZ_TOKEN``: all the integration is given."""
    value = server.create_deployment("inspect-tests")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("ASTRO_AUTHZ_TOKEN", value)
        yield value


@pytest.fixture(scope="module")
def eval_token(server: PlatformServer) -> str:
    """A deployment of its own for the tests that count every sandbox of ours in it."""
    return server.create_deployment("inspect-eval")


class Case(NamedTuple):
    config: PodbaySandboxEnvironmentConfig | None
    #: Checks this configuration cannot pass, and why (strict: they must fail).
    xfails: dict[str, str]


ROOT_CAN = "root may read and write any file whatever its mode"
CASES = {
    # The server's default account: root.
    "root": Case(
        None,
        {
            "test_read_file_not_allowed": ROOT_CAN,
            "test_write_text_file_without_permissions": ROOT_CAN,
            "test_write_binary_file_without_permissions": ROOT_CAN,
        },
    ),
    # The image's ordinary account: every permission check holds.
    "user": Case(
        PodbaySandboxEnvironmentConfig(
            user="user", environment={"FROM_CONFIG": "1"}, sandbox_class="container"
        ),
        {},
    ),
    # The same on the default class, gVisor, whose agent acts as a user another
    # way (its thread's effective ids: gVisor has no setfsuid).
    "user-gvisor": Case(
        PodbaySandboxEnvironmentConfig(
            user="user", environment={"FROM_CONFIG": "1"}, sandbox_class="gvisor"
        ),
        {},
    ),
}


class CaseAndEnv(NamedTuple):
    case: Case
    env: PodbaySandboxEnvironment


@pytest.fixture(scope="module", params=sorted(CASES))
async def case_and_env(request: pytest.FixtureRequest, token: str) -> AsyncIterator[CaseAndEnv]:
    # One sandbox per configuration, shared by the checks (they clean up after
    # themselves), set up and torn down as inspect does for a sample.
    case = CASES[request.param]
    task = f"self-check-{request.param}"
    await PodbaySandboxEnvironment.task_init(task, case.config)
    envs = await PodbaySandboxEnvironment.sample_init(task, case.config, {})
    env = envs["default"]
    assert isinstance(env, PodbaySandboxEnvironment)
    try:
        yield CaseAndEnv(case, env)
    finally:
        await PodbaySandboxEnvironment.sample_cleanup(task, case.config, envs, False)
        await PodbaySandboxEnvironment.task_cleanup(task, case.config, True)
    with SandboxClient() as client:
        assert env.name not in {r.name for r in client.list()}  # deleted at clean-up


@pytest.fixture
def sandbox_env(request: pytest.FixtureRequest, case_and_env: CaseAndEnv) -> SandboxEnvironment:
    reason = case_and_env.case.xfails.get(request.node.originalname)
    if reason is not None:
        request.node.add_marker(pytest.mark.xfail(reason=reason, strict=True))
    return case_and_env.env


# -- what inspect's checks leave out ------------------------------------------------------


async def test_exec_output_over_the_limit_raises_with_its_tail(
    sandbox_env: SandboxEnvironment,
) -> None:
    with override_max_exec_output_size(1024), pytest.raises(OutputLimitExceededError) as caught:
        await sandbox_env.exec(["sh", "-c", "printf 'a%.0s' $(seq 3000); printf END"])
    assert "limit of 1 KiB was exceeded" in str(caught.value)
    assert caught.value.truncated_output is not None
    assert caught.value.truncated_output.endswith("aaaEND")  # the tail is what is kept
    assert len(caught.value.truncated_output) == 1024


async def test_exec_timeout_carries_the_output_so_far(sandbox_env: SandboxEnvironment) -> None:
    with pytest.raises(TimeoutError) as caught:
        await sandbox_env.exec(["sh", "-c", "echo started; sleep 30"], timeout=1)
    assert getattr(caught.value, "truncated_output", None) == "started\n"


async def test_env_user_and_working_dir(
    sandbox_env: SandboxEnvironment, case_and_env: CaseAndEnv
) -> None:
    config = case_and_env.case.config or PodbaySandboxEnvironmentConfig()
    probe = "echo $(id -un) $PWD ${FROM_CONFIG:-none} $MINE"
    result = await sandbox_env.exec(["sh", "-c", probe], env={"MINE": "x"})
    assert result.stdout.split() == [
        config.user or "root",
        "/workspace",
        config.environment.get("FROM_CONFIG", "none"),
        "x",
    ]
    # A command's own env wins over the config's, its own user over the default.
    result = await sandbox_env.exec(["sh", "-c", probe], env={"FROM_CONFIG": "2"}, user="root")
    assert result.stdout.split()[0] == "root"
    assert result.stdout.split()[2] == "2"
    # Files the sample writes belong to the account it runs as.
    await sandbox_env.write_file("owned.txt", "mine")
    owner = await sandbox_env.exec(["stat", "-c", "%U", "owned.txt"])
    assert owner.stdout.strip() == (config.user or "root")
    await sandbox_env.exec(["rm", "owned.txt"])


async def test_what_cannot_start_is_a_failed_result(sandbox_env: SandboxEnvironment) -> None:
    # As a shell reports it: 127 for a command not found, 126 for a cwd it cannot use.
    result = await sandbox_env.exec(["no-such-command-here"])
    assert not result.success
    assert result.returncode == 127
    assert "no-such-command-here" in result.stderr
    result = await sandbox_env.exec(["true"], cwd="/no/such/dir")
    assert result.returncode == 126
    assert "/no/such/dir" in result.stderr


async def test_a_file_on_the_path_is_not_a_directory(sandbox_env: SandboxEnvironment) -> None:
    with pytest.raises(NotADirectoryError, match="/etc/hostname/x"):
        await sandbox_env.write_file("/etc/hostname/x", "x")
    with pytest.raises(NotADirectoryError, match="/etc/hostname/x"):
        await sandbox_env.read_file("/etc/hostname/x")


async def test_connection_names_the_sandbox(sandbox_env: SandboxEnvironment) -> None:
    assert isinstance(sandbox_env, PodbaySandboxEnvironment)
    connection = await sandbox_env.connection()
    assert connection.type == "podbay"
    assert connection.container == sandbox_env.name
    assert connection.command.startswith(f"podbay sandbox shell {sandbox_env.name} ")


# -- an eval, as a user runs it -------------------------------------------------------------

TASK = '''
from inspect_ai import Task, task
from inspect_ai.dataset import Sample
from inspect_ai.model import ModelOutput, ModelUsage, get_model
from inspect_ai.scorer import includes
from inspect_ai.solver import generate, use_tools
from inspect_ai.tool import bash, text_editor


def script(messages, tools, tool_choice, config):
    """bash, then text_editor (inspect's own tools server, put into the sandbox by
    inspect), then an answer with what bash printed. No network, no key."""
    results = [m.text for m in messages if m.role == "tool"]
    if not results:
        output = ModelOutput.for_tool_call(
            "mockllm/model", "bash", {"command": "cat secret.txt; echo; hostname; id -un"}
        )
    elif len(results) == 1:
        output = ModelOutput.for_tool_call(
            "mockllm/model",
            "text_editor",
            {"command": "create", "path": "/workspace/answer.txt", "file_text": results[0]},
        )
    else:
        output = ModelOutput.from_content("mockllm/model", "ANSWER: " + results[0].strip())
    # Usage given, so the mock does not count tokens (its tokenizer downloads its tables).
    output.usage = ModelUsage(input_tokens=1, output_tokens=1, total_tokens=2)
    return output


@task
def secrets():
    return Task(
        dataset=[
            Sample(input="What is the secret?", target=s, files={"secret.txt": s}, id=s)
            for s in ("podbay-secret-1", "podbay-secret-2")
        ],
        solver=[use_tools(bash(timeout=60), text_editor()), generate()],
        scorer=includes(),
        sandbox="podbay",
        model=get_model("mockllm/model", custom_outputs=script),
    )
'''


def test_inspect_eval_runs_bash_in_podbay_sandboxes(
    eval_token: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("ASTRO_AUTHZ_TOKEN", eval_token)
    (tmp_path / "find_secret.py").write_text(TASK)  # note: it imports nothing of podbay
    logs = tmp_path / "logs"
    env = {**os.environ, "INSPECT_DISPLAY": "none"}
    run = subprocess.run(
        [
            str(Path(sys.executable).parent / "inspect"),  # the command users run
            "eval",
            "find_secret.py",
            "--log-dir",
            str(logs),
            "--log-format",
            "json",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    [path] = logs.glob("*.json")
    # Read in a thread of its own: in this one, where the anyio plugin runs
    # the module's async tests, inspect would take the test for one running
    # in an asyncio loop and patch asyncio for the rest of the process
    # (nest_asyncio2), after which every asyncio.run leaves its loop unclosed.
    with ThreadPoolExecutor(1) as pool:
        log = pool.submit(read_eval_log, str(path)).result()
    assert not getattr(asyncio, "_nest_patched", False)
    assert log.status == "success", log.error
    assert log.eval.sandbox is not None
    assert log.eval.sandbox.type == "podbay"
    assert log.samples is not None
    assert len(log.samples) == 2
    hostnames = set()
    for sample in log.samples:
        secret = str(sample.id)
        assert sample.scores is not None
        assert sample.scores["includes"].value == "C", sample.output.completion
        events = [json.loads(e.model_dump_json()) for e in sample.events]
        # The tool calls and the sandbox commands they ran, all in the log.
        tool, editor = [e for e in events if e["event"] == "tool"]
        assert tool["function"] == "bash"
        assert tool["result"].startswith(secret + "\n")
        assert editor["function"] == "text_editor", editor
        assert editor["error"] is None, editor
        assert editor["result"] == "File created successfully at: /workspace/answer.txt"
        execs = [e for e in events if e["event"] == "sandbox" and e["action"] == "exec"]
        bash_runs = [e for e in execs if e["cmd"].startswith("bash --login -c")]
        assert len(bash_runs) == 1
        assert bash_runs[0]["result"] == 0
        assert bash_runs[0]["output"].startswith(secret)
        # The sample's files went in through write_file.
        writes = [e for e in events if e["event"] == "sandbox" and e["action"] == "write_file"]
        assert [w["file"] for w in writes] == ["secret.txt"]
        hostname, user = tool["result"].split()[1:3]
        assert user == "root"
        assert hostname.startswith(NAME_PREFIX + "secrets-")
        hostnames.add(hostname)
    assert len(hostnames) == 2  # one sandbox per sample
    with SandboxClient() as client:
        assert not [r.name for r in client.list() if r.name.startswith(NAME_PREFIX)]


async def test_the_config_class_is_asked_for(
    eval_token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # This server runs containers only: asking for vm is refused, and nothing is left.
    monkeypatch.setenv("ASTRO_AUTHZ_TOKEN", eval_token)
    config = PodbaySandboxEnvironmentConfig(sandbox_class="vm")
    with pytest.raises(SandboxRequestError) as refused:
        await PodbaySandboxEnvironment.sample_init("vm-task", config, {})
    assert refused.value.code == "SANDBOX_CLASS_UNAVAILABLE"
    with SandboxClient() as client:
        assert not [r.name for r in client.list() if r.name.startswith(NAME_PREFIX)]
        [env] = await left_behind(1, PodbaySandboxEnvironmentConfig(sandbox_class="container"))
        assert client.get(env.name).class_ == "container"
        await PodbaySandboxEnvironment.sample_cleanup("vm-task", None, {"default": env}, False)


async def left_behind(
    count: int, config: PodbaySandboxEnvironmentConfig | None = None
) -> list[PodbaySandboxEnvironment]:
    """Samples set up and not cleaned up (an interrupted run, --no-sandbox-cleanup)."""
    envs = []
    for _ in range(count):
        env = (await PodbaySandboxEnvironment.sample_init("left", config, {}))["default"]
        assert isinstance(env, PodbaySandboxEnvironment)
        envs.append(env)
    return envs


async def test_what_samples_left_is_deleted_by_task_or_cli_cleanup(
    eval_token: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ASTRO_AUTHZ_TOKEN", eval_token)
    # One eval batch's provider state, as `inspect eval` opens it.
    with SandboxClient() as client, sandbox_lifecycle_scope():

        def ours() -> set[str]:
            return {r.name for r in client.list() if r.name.startswith(NAME_PREFIX)}

        # The batch's final task_cleanup deletes what no sample clean-up did...
        [env] = await left_behind(1)
        await env.client.aclose()
        assert ours() == {env.name}
        await PodbaySandboxEnvironment.task_cleanup("shutdown", None, True)
        assert ours() == set()
        # ...unless told not to (--no-sandbox-cleanup); then `inspect sandbox cleanup
        # podbay [NAME]` (cli_cleanup) deletes them by name, or all of ours.
        envs = await left_behind(2)
        for env in envs:
            await env.client.aclose()
        await PodbaySandboxEnvironment.task_cleanup("shutdown", None, False)
        assert ours() == {env.name for env in envs}
        await PodbaySandboxEnvironment.cli_cleanup(envs[0].name)
        assert ours() == {envs[1].name}
        # The command itself: inspect finds the type through the entry point.
        inspect = str(Path(sys.executable).parent / "inspect")
        done = await anyio.run_process([inspect, "sandbox", "cleanup", "podbay"], check=False)
        assert done.returncode == 0, done.stdout + done.stderr
        assert ours() == set()
