"""E2B's code interpreter SDK (``e2b-code-interpreter``, pinned in the dev
extra) against a real ``podbay serve``, unchanged: ``run_code`` and the
contexts, answered by podbay's own interpreter kernel inside the sandbox.
One server per class for the module."""

from __future__ import annotations

import asyncio
import base64
from collections.abc import Iterator
from typing import Any

import pytest

from podbay.testing.fixtures import shared_layer_dir
from podbay.testing.platform import PYDATA_SECTION, SANDBOX_SPEC, PlatformServer

ci = pytest.importorskip("e2b_code_interpreter")
e2b = pytest.importorskip("e2b")

pytestmark = pytest.mark.root


@pytest.fixture(scope="module", params=["gvisor", "container"])
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[PlatformServer]:
    with PlatformServer.start(
        tmp_path_factory.mktemp("e2b-ci"),
        # matplotlib's layer (the PNG test) is built once per machine, not per run.
        env={
            "PODBAY_RUNTIME_CLASSES": request.param,
            "PODBAY_RUNTIME_LAYER_DIR": shared_layer_dir(),
        },
    ) as s:
        yield s


def _opts(server: PlatformServer, name: str, spec: str) -> dict[str, Any]:
    out = server.cli("deployment", "create", name, "--spec", "-", "--e2b-key", input=spec)
    key = out.stdout.strip().splitlines()[-1]
    # code-interpreter-v1 (the SDK's default template) is not served yet: base is.
    return {
        "api_key": key,
        "api_url": server.base_url,
        "sandbox_url": server.base_url,
        "template": "base",
    }


@pytest.fixture(scope="module")
def opts(server: PlatformServer) -> dict[str, Any]:
    return _opts(server, "e2b-ci", SANDBOX_SPEC)


@pytest.fixture(scope="module")
def sandbox(opts: dict[str, Any]) -> Iterator[Any]:
    sandbox = ci.Sandbox.create(**opts)
    yield sandbox
    sandbox.kill()


def test_state_output_results_and_errors(sandbox: Any) -> None:
    first = sandbox.run_code("x = 1")
    assert first.error is None
    assert first.results == []
    second = sandbox.run_code("x + 1")
    assert second.text == "2"
    assert second.execution_count == first.execution_count + 1

    seen: list[Any] = []
    printed = sandbox.run_code(
        "import sys\nprint('hello')\nprint('oops', file=sys.stderr)",
        on_stdout=seen.append,
        on_stderr=seen.append,
    )
    assert printed.logs.stdout == ["hello\n"]
    assert printed.logs.stderr == ["oops\n"]
    assert [(m.line, m.error) for m in seen] == [("hello\n", False), ("oops\n", True)]
    assert all(m.timestamp > 0 for m in seen)

    errors: list[Any] = []
    failed = sandbox.run_code("def f():\n    return 1 / 0\nf()", on_error=errors.append)
    assert failed.error is not None
    assert errors == [failed.error]
    assert (failed.error.name, failed.error.value) == ("ZeroDivisionError", "division by zero")
    assert "return 1 / 0" in failed.error.traceback
    assert sandbox.run_code("x").text == "1"  # the interpreter survived the exception

    rich = sandbox.run_code(
        "class T:\n"
        "    def _repr_html_(self): return '<b>t</b>'\n"
        "    def _repr_json_(self): return {'a': [1, 2]}\n"
        "T()"
    )
    (result,) = rich.results
    assert result.is_main_result
    assert result.html == "<b>t</b>"
    assert result.json == {"a": [1, 2]}

    envs = sandbox.run_code("import os; os.environ['CELL_VAR']", envs={"CELL_VAR": "set"})
    assert envs.text == "'set'"
    assert sandbox.run_code("os.environ.get('CELL_VAR')").results == []  # for that cell only


def test_stdout_streams_while_the_cell_runs(sandbox: Any) -> None:
    # The cell waits (at most 60 s) for a file that the on_stdout callback
    # writes when the first line arrives: only a streamed line can make it.
    cell = (
        "import os, time\n"
        "print('first')\n"
        "for _ in range(1200):\n"
        "    if os.path.exists('/tmp/streamed'):\n"
        "        break\n"
        "    time.sleep(0.05)\n"
        "print('second' if os.path.exists('/tmp/streamed') else 'not streamed')\n"
        "print('no newline', end='')"
    )

    def on_stdout(message: Any) -> None:
        if message.line == "first\n":
            sandbox.files.write("/tmp/streamed", "")

    ran = sandbox.run_code(cell, on_stdout=on_stdout)
    assert ran.logs.stdout == ["first\n", "second\n", "no newline"]


def test_bash_keeps_its_shell_between_cells(sandbox: Any) -> None:
    seen: list[str] = []
    first = sandbox.run_code(
        "X=7; cd /tmp; echo $X", language="bash", on_stdout=lambda m: seen.append(m.line)
    )
    assert first.error is None
    assert first.logs.stdout == ["7\n"]
    assert seen == ["7\n"]
    assert sandbox.run_code("echo $X $(pwd)", language="bash").logs.stdout == ["7 /tmp\n"]
    cell_env = sandbox.run_code("echo $X-$ONE", language="bash", envs={"ONE": "1"})
    assert cell_env.logs.stdout == ["7-1\n"]
    failed = sandbox.run_code("echo oops >&2; false", language="bash")
    assert failed.logs.stderr == ["oops\n"]
    assert failed.error is not None
    assert (failed.error.name, failed.error.value) == ("BashExitError", "exit status 1")
    # bash is its own context: python's variables are not its
    assert sandbox.run_code("'X' in dir()").text == "False"

    context = sandbox.create_code_context(cwd="/tmp", language="bash")
    assert context.language == "bash"
    assert sandbox.run_code("pwd; echo ${X:-unset}", context=context).logs.stdout == [
        "/tmp\nunset\n"
    ]
    sandbox.remove_code_context(context)


def test_a_paused_sandbox_resumes_with_its_interpreter(opts: dict[str, Any]) -> None:
    # Cells reuse the data plane they attached to; a pause makes the gateway
    # refuse it, and the cell then attaches again (resuming) and runs.
    sandbox = ci.Sandbox.create(**opts)
    try:
        sandbox.run_code("kept = 3")
        sandbox.pause()
        assert sandbox.run_code("kept").text == "3"  # suspend keeps the process's memory
    finally:
        sandbox.kill()


def test_timeout_interrupts_the_cell(sandbox: Any) -> None:
    # The SDK's timeout closes the request; the cell must stop with it, not run
    # on and hold up the next one: that one sees the interrupt's trace.
    cell = "import time\ntry:\n    time.sleep(120)\nexcept KeyboardInterrupt:\n    stopped = True"
    with pytest.raises(e2b.TimeoutException):
        sandbox.run_code(cell, timeout=1)
    assert sandbox.run_code("stopped").text == "True"


def test_contexts_have_their_own_cwd_and_state(sandbox: Any) -> None:
    context = sandbox.create_code_context(cwd="/tmp", language="python")
    assert (context.language, context.cwd) == ("python", "/tmp")
    assert sandbox.run_code("import os; os.getcwd()", context=context).text == "'/tmp'"
    sandbox.run_code("only_here = 5", context=context)
    assert sandbox.run_code("'only_here' in dir()").text == "False"  # the default context
    assert sandbox.run_code("only_here", context=context).text == "5"
    assert context.id in [c.id for c in sandbox.list_code_contexts()]

    sandbox.restart_code_context(context)
    assert sandbox.run_code("'only_here' in dir()", context=context).text == "False"
    assert sandbox.run_code("import os; os.getcwd()", context=context).text == "'/tmp'"

    sandbox.remove_code_context(context)
    assert context.id not in [c.id for c in sandbox.list_code_contexts()]
    with pytest.raises(e2b.NotFoundException):
        sandbox.run_code("1", context=context)


def test_async_sdk(opts: dict[str, Any]) -> None:
    async def main() -> None:
        sandbox = await ci.AsyncSandbox.create(**opts)
        try:
            await sandbox.run_code("y = 41")
            seen: list[str] = []
            ran = await sandbox.run_code(
                "print('async'); y + 1", on_stdout=lambda m: seen.append(m.line)
            )
            assert (ran.text, seen) == ("42", ["async\n"])
            context = await sandbox.create_code_context(cwd="/")
            assert (await sandbox.run_code("import os; os.getcwd()", context=context)).text == "'/'"
            # the default python and bash contexts and this one
            assert len(await sandbox.list_code_contexts()) == 3
            await sandbox.restart_code_context(context)
            await sandbox.remove_code_context(context.id)
            failed = await sandbox.run_code("raise ValueError('bad')")
            assert failed.error is not None
            assert failed.error.name == "ValueError"
        finally:
            await sandbox.kill()

    asyncio.run(main())


def test_refusals(server: PlatformServer, sandbox: Any) -> None:
    with pytest.raises(e2b.SandboxException, match="not supported"):
        sandbox.run_code("cat('hi')", language="r")
    with pytest.raises(e2b.SandboxException, match="absolute"):
        sandbox.create_code_context(cwd="relative")
    with pytest.raises(e2b.SandboxException, match="not a directory"):
        sandbox.create_code_context(cwd="/no/such/dir")
    with pytest.raises(e2b.NotFoundException):
        sandbox.restart_code_context("nope")
    headers = {"E2b-Sandbox-Id": sandbox.sandbox_id, "E2b-Sandbox-Port": "49999"}
    # Neither the access token nor the traffic token: nothing runs.
    answer = server.http.post("/execute", headers=headers, json={"code": "1"})
    assert answer.status_code == 401
    assert answer.json()["error_code"] == "E2B_ACCESS_TOKEN_MISSING"
    wrong = server.http.get("/contexts", headers={**headers, "E2B-Traffic-Access-Token": "x"})
    assert wrong.status_code == 401
    bad = server.http.post(
        "/execute",
        headers={**headers, "X-Access-Token": sandbox._envd_access_token},
        content=b"[1]",
    )
    assert bad.status_code == 400
    assert bad.json()["error_code"] == "REQUEST_INVALID"


def test_matplotlib_figure_is_a_png(server: PlatformServer) -> None:
    # matplotlib comes from the deployment's declared layer (docs/interpreter.md);
    # its first build on a machine may outlast the SDK's default request timeout.
    opts = _opts(server, "e2b-ci-pydata", "name: e2b-ci-pydata\n" + PYDATA_SECTION)
    sandbox = ci.Sandbox.create(**opts, request_timeout=900)
    try:
        plotted = sandbox.run_code(
            "import matplotlib.pyplot as plt\nplt.plot([1, 4, 9])\nplt.show()"
        )
        assert plotted.error is None
        (figure,) = plotted.results
        assert not figure.is_main_result
        assert "Figure" in figure.text
        assert base64.b64decode(figure.png).startswith(b"\x89PNG\r\n\x1a\n")
    finally:
        sandbox.kill()
