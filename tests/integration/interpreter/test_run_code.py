"""run_code over real sandboxes: a stateful interpreter INSIDE the sandbox (its
kernel a spawned process there), reached through the gateway's port relay.
matplotlib comes from the deployment's declared environment, built once per
machine into the test sessions' shared layer cache."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import anyio
import pytest

from podbay.client import AsyncSandboxClient, SandboxClient
from podbay.testing.fixtures import shared_layer_dir
from podbay.testing.platform import PYDATA_SECTION, PlatformServer

pytestmark = pytest.mark.root

SPEC = "name: interpreter-tests\n" + PYDATA_SECTION


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PlatformServer]:
    with PlatformServer.start(
        tmp_path_factory.mktemp("serve-interpreter"),
        env={"PODBAY_RUNTIME_LAYER_DIR": shared_layer_dir()},
    ) as s:
        yield s


@pytest.fixture(scope="module")
def token(server: PlatformServer) -> str:
    return server.create_deployment("interpreter-tests", SPEC)


@pytest.fixture(scope="module")
def client(server: PlatformServer, token: str) -> Iterator[SandboxClient]:
    # The first attach waits for the environment (matplotlib) to build.
    with SandboxClient(
        identity_token=token, server_url=server.base_url, prepare_timeout_seconds=900
    ) as c:
        yield c


@pytest.fixture(scope="module")
def name(client: SandboxClient) -> Iterator[str]:
    sandbox = f"interp-{uuid.uuid4().hex[:8]}"
    client.attach(sandbox)
    yield sandbox
    client.delete(sandbox)


def test_state_output_and_errors(client: SandboxClient, name: str) -> None:
    sb = client.sandbox(name)
    first = sb.run_code("x = 1")
    assert first.error is None
    assert first.result is None
    second = sb.run_code("x + 1")
    assert second.text == "2"
    assert second.error is None
    assert second.kernel_id == first.kernel_id
    assert second.execution_count == first.execution_count + 1

    out = sb.run_code("import sys\nprint('to out')\nprint('to err', file=sys.stderr)\nx * 10")
    assert (out.stdout, out.stderr, out.text) == ("to out\n", "to err\n", "10")

    failed = sb.run_code("def f():\n    return 1 / 0\nf()")
    assert failed.error is not None
    assert (failed.error.name, failed.error.value) == ("ZeroDivisionError", "division by zero")
    assert 'File "<cell-' in failed.error.traceback
    assert "return 1 / 0" in failed.error.traceback
    syntax = sb.run_code("x = = 2")
    assert syntax.error is not None
    assert syntax.error.name == "SyntaxError"
    # The interpreter itself runs in the sandbox, not here.
    where = sb.run_code("import socket, os; socket.gethostname(), os.getpid()")
    assert where.text is not None
    assert where.text != repr((__import__("socket").gethostname(), __import__("os").getpid()))
    assert sb.run_code("x").text == "1"


def test_rich_outputs(client: SandboxClient, name: str) -> None:
    sb = client.sandbox(name)
    plot = sb.run_code(
        "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [1, 4, 9])\nplt.title('squares')"
    )
    assert plot.error is None, plot.error
    figures = [r for r in plot.results if not r.is_main_result]
    assert len(figures) == 1
    png = figures[0].png
    assert png is not None
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    assert len(png) > 1000
    assert plot.text == "Text(0.5, 1.0, 'squares')"

    returned = sb.run_code("fig, ax = plt.subplots()\nax.bar([1, 2], [3, 4])\nfig")
    assert returned.result is not None
    assert returned.result.png is not None
    assert len(returned.results) == 1  # shown once, not again as an open figure

    rich = sb.run_code(
        "class Table:\n"
        "    def _repr_html_(self): return '<table><tr><td>1</td></tr></table>'\n"
        "    def _repr_json_(self): return {'rows': [[1]]}\n"
        "    def __repr__(self): return 'Table(1 row)'\n"
        "Table()"
    )
    assert rich.result is not None
    assert rich.result.html == "<table><tr><td>1</td></tr></table>"
    assert rich.result.json == {"rows": [[1]]}
    assert rich.text == "Table(1 row)"


def test_an_infinite_loop_is_interrupted_and_the_state_kept(
    client: SandboxClient, name: str
) -> None:
    sb = client.sandbox(name)
    sb.run_code("kept = 'still here'")
    looped = sb.run_code("n = 0\nwhile True:\n    n += 1", timeout_ms=1000)
    assert looped.timed_out
    assert looped.error is not None
    assert looped.error.name == "KeyboardInterrupt"
    slept = sb.run_code("import time\ntime.sleep(600)", timeout_ms=500)
    assert slept.timed_out
    assert slept.error is not None
    after = sb.run_code("kept, n > 0")
    assert after.text == "('still here', True)"
    assert not after.restarted
    assert after.kernel_id == looped.kernel_id


def test_a_crash_restarts_cleanly_and_says_so(client: SandboxClient, name: str) -> None:
    sb = client.sandbox(name)
    before = sb.run_code("doomed = 1")
    crashed = sb.run_code("import os\nos._exit(3)")
    assert crashed.error is not None
    assert crashed.error.name == "InterpreterCrashed"
    assert "state is lost" in crashed.error.value
    fresh = sb.run_code("doomed")
    assert fresh.restarted
    assert fresh.kernel_id != before.kernel_id
    assert fresh.error is not None
    assert fresh.error.name == "NameError"
    assert sb.run_code("1 + 1").text == "2"


def test_suspend_and_resume_keep_the_state(client: SandboxClient, name: str) -> None:
    sb = client.sandbox(name)
    before = sb.run_code("y = 5")
    sb.stop()  # suspend: the sandbox's processes are frozen with their memory
    resumed = sb.run_code("y * 2")
    assert resumed.text == "10"
    assert not resumed.restarted
    assert resumed.kernel_id == before.kernel_id


def test_an_interpreter_gone_between_cells_is_replaced(client: SandboxClient, name: str) -> None:
    sb = client.sandbox(name)
    pid = sb.run_code("z = 1\nimport os\nos.getpid()").text
    assert pid is not None
    assert sb.exec(["kill", "-KILL", pid]).exit_code == 0
    # Nothing listens now: the cell runs in a new interpreter, flagged restarted.
    replaced = sb.run_code("'z' in globals(), 3 * 3")
    assert replaced.text == "(False, 9)"
    assert replaced.restarted
    assert replaced.error is None
    # And on purpose: restart() kills it, the next cell says so.
    sb.code_interpreter.restart()
    again = sb.run_code("1")
    assert again.restarted
    assert again.kernel_id != replaced.kernel_id


def test_async_face_shares_the_sandbox_interpreter(
    client: SandboxClient, token: str, server: PlatformServer, name: str
) -> None:
    client.sandbox(name).run_code("shared = [1, 2]")

    async def main() -> tuple[str | None, bool]:
        async with AsyncSandboxClient(identity_token=token, server_url=server.base_url) as ac:
            sb = ac.sandbox(name)
            result = await sb.run_code("shared + [3]")
            return result.text, result.restarted

    # Another client finds the running kernel (its token file) instead of starting one.
    assert anyio.run(main) == ("[1, 2, 3]", False)
