"""The code interpreter API's pieces that need no sandbox: the kernel's answer
as E2B's JSON lines (hostile answers included), the contexts file read from
the sandbox, and the kernel's streamed answer and per-cell env (the real
kernel, run here as a process)."""

from __future__ import annotations

import asyncio
import http.client
import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from podbay.client import _interpreter
from podbay.e2b import interpreter


def _lines(payload: dict[str, Any]) -> list[dict[str, Any]]:
    return [json.loads(line) for line in interpreter.execution_lines(payload)]


def test_an_answer_becomes_e2b_lines() -> None:
    lines = _lines(
        {
            "stdout": "out\n",
            "stderr": "",
            "results": [
                {"main": True, "formats": {"text/plain": "2", "text/html": "<b>2</b>"}},
                {"main": False, "formats": {"image/png": "iVBO", "x/custom": 1}},
            ],
            "error": {"name": "ValueError", "value": "bad", "traceback": "tb"},
            "execution_count": 3,
        }
    )
    assert [line["type"] for line in lines] == [
        "stdout",
        "result",
        "result",
        "error",
        "number_of_executions",
        "end_of_execution",
    ]
    assert lines[0]["text"] == "out\n"
    assert lines[0]["timestamp"] > 0
    assert lines[1] == {
        "type": "result",
        "text": "2",
        "html": "<b>2</b>",
        "is_main_result": True,
        "extra": None,
    }
    assert lines[2]["png"] == "iVBO"
    assert lines[2]["extra"] == {"x/custom": 1}
    assert lines[3] == {"type": "error", "name": "ValueError", "value": "bad", "traceback": "tb"}
    assert lines[4]["execution_count"] == 3


def test_a_hostile_answer_gives_lines_not_a_crash() -> None:
    lines = _lines(
        {"stdout": ["x"], "results": [{"formats": "nope"}, 5], "execution_count": "9", "error": 1}
    )
    assert [line["type"] for line in lines] == [
        "stdout",
        "result",
        "number_of_executions",
        "end_of_execution",
    ]
    assert lines[2]["execution_count"] == 0


class FakePlane:
    """The sandbox's files, as the contexts registry reads them."""

    def __init__(self, files: dict[str, bytes]) -> None:
        self.files = files

    async def read(self, path: str) -> bytes | None:
        return self.files.get(path)


@pytest.mark.parametrize(
    "stored",
    [
        b"not json",
        b"[1, 2]",
        json.dumps({"../x": {"id": "../x", "language": "python", "cwd": "/", "port": 50000}}),
        json.dumps({"a" * 32: {"id": "a" * 32, "language": "python", "cwd": "/", "port": "x"}}),
        json.dumps({"a" * 32: {"id": "a" * 32, "language": "python", "cwd": "/", "port": 22}}),
        json.dumps({"a" * 32: {"id": "b" * 32, "language": "python", "cwd": "/", "port": 50000}}),
        json.dumps({"a" * 32: {"id": "a" * 32, "language": "cobol", "cwd": "/", "port": 50000}}),
        json.dumps({"bash": {"id": "bash", "language": "bash", "cwd": "/", "port": 50000}}),
    ],
)
def test_only_well_formed_contexts_are_read(stored: bytes | str) -> None:
    raw = stored.encode() if isinstance(stored, str) else stored
    plane: Any = FakePlane({interpreter.CONTEXTS_FILE: raw})
    registry = interpreter.Registry.__new__(interpreter.Registry)
    contexts = asyncio.run(registry.contexts(plane))
    assert list(contexts) == ["python", "bash"]  # the defaults only


def test_a_well_formed_context_is_read() -> None:
    entry = {"id": "a" * 32, "language": "python", "cwd": "/tmp", "port": 50001}
    plane: Any = FakePlane({interpreter.CONTEXTS_FILE: json.dumps({"a" * 32: entry}).encode()})
    registry = interpreter.Registry.__new__(interpreter.Registry)
    assert asyncio.run(registry.contexts(plane))["a" * 32] == entry


# -- the kernel, as a local process --------------------------------------------------------
@pytest.fixture
def kernel(tmp_path: Path) -> Iterator[tuple[int, str]]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    token_file = tmp_path / "token"
    source = tmp_path / "kernel.py"
    source.write_bytes(_interpreter.kernel_source())
    process = subprocess.Popen([sys.executable, "-u", str(source), str(port), str(token_file)])
    try:
        while not token_file.exists():  # published once the port is bound
            assert process.poll() is None
            time.sleep(0.01)
        yield port, token_file.read_text()
    finally:
        process.kill()
        process.wait()


def _run(port: int, token: str, body: dict[str, Any]) -> tuple[str, str]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    connection.request(
        "POST",
        "/run",
        json.dumps(body),
        {_interpreter.TOKEN_HEADER: token, "Content-Type": "application/json"},
    )
    answer = connection.getresponse()
    kind, data = answer.getheader("Content-Type") or "", answer.read().decode()
    connection.close()
    return kind, data


def test_the_kernel_streams_writes_then_the_answer(kernel: tuple[int, str]) -> None:
    port, token = kernel
    kind, data = _run(
        port,
        token,
        {"code": "import sys\nprint('a')\nprint('b', file=sys.stderr)\n40 + 2", "stream": True},
    )
    assert kind == "application/x-ndjson"
    items = [json.loads(line) for line in data.splitlines()]
    for stream, text in (("stdout", "a\n"), ("stderr", "b\n")):
        assert "".join(i["text"] for i in items[:-1] if i["stream"] == stream) == text
    done = items[-1]["done"]
    assert done["stdout"] == "a\n"
    assert done["results"][0]["formats"]["text/plain"] == "42"


def test_the_kernel_sets_env_for_one_cell(kernel: tuple[int, str]) -> None:
    port, token = kernel
    _, data = _run(port, token, {"code": "import os; os.environ['K']", "env": {"K": "v"}})
    assert json.loads(data)["results"][0]["formats"]["text/plain"] == "'v'"
    _, data = _run(port, token, {"code": "os.environ.get('K')"})
    assert json.loads(data)["results"] == []
    _, refused = _run(port, token, {"code": "1", "env": {"K": 1}})
    assert json.loads(refused)["code"] == "REQUEST_INVALID"


def _bash(port: int, token: str, code: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    cell = f"{interpreter.BASH_CELL}\nbash_cell({code!r}, {env!r})\n"
    _, data = _run(port, token, {"code": cell})
    answer: dict[str, Any] = json.loads(data)
    return answer


def test_bash_cells_keep_their_shell(kernel: tuple[int, str]) -> None:
    port, token = kernel
    first = _bash(port, token, "X=7; cd /; echo $X; echo to-stderr >&2; printf 'no newline'")
    assert (first["stdout"], first["stderr"], first["error"]) == (
        "7\nno newline",
        "to-stderr\n",
        None,
    )
    second = _bash(port, token, "echo $X $(pwd)")
    assert second["stdout"] == "7 /\n"
    failed = _bash(port, token, "echo before; false")
    assert failed["stdout"] == "before\n"
    assert (failed["error"]["name"], failed["error"]["value"]) == ("BashExitError", "exit status 1")
    broken = _bash(port, token, "if then")  # a syntax error fails this cell only
    assert broken["error"]["name"] == "BashExitError"
    assert _bash(port, token, 'read line; echo "[$line] $X"')["stdout"] == "[] 7\n"
    exited = _bash(port, token, "exit 3")  # the shell is gone: the next cell gets a new one
    assert exited["error"]["name"] == "BashExitError"
    assert _bash(port, token, 'echo "[$X]"')["stdout"] == "[]\n"


def test_bash_env_lasts_one_cell(kernel: tuple[int, str]) -> None:
    port, token = kernel
    ran = _bash(port, token, 'echo "$K"; sh -c \'echo "$K"\'', {"K": "a 'b'"})
    assert ran["stdout"] == "a 'b'\na 'b'\n"
    assert _bash(port, token, 'echo "[$K]"')["stdout"] == "[]\n"
    refused = _bash(port, token, "true", {"A;rm": "x"})
    assert refused["error"]["name"] == "ValueError"
