"""Environment, refusal mapping, file streaming, staging, version and CLI."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

import podbay
from podbay.agent import VERSION
from podbay.agent.environment import EnvFileError, command_env, load_env_file
from podbay.agent.files import Files
from podbay.agent.http import Aborted
from podbay.agent.reaper import exit_code
from podbay.agent.refusal import path_refusal
from podbay.runtime.staging import agent_argv, stage
from podbay.wire.codes import ErrorCode


def test_version_matches_the_package() -> None:
    assert podbay.__version__ == VERSION


def test_env_layers_and_env_file(tmp_path: Path) -> None:
    good = tmp_path / "env.json"
    good.write_text(json.dumps({"A": "1", "PATH": "/x"}))
    declared = load_env_file(str(good))
    env = command_env(declared, {"A": "2"})
    assert env["A"] == "2"
    assert env["PATH"] == "/x"
    assert env["HOME"] == "/root"
    for bad in ("[1]", '{"A": 1}', '{"A=B": "x"}', "{nope"):
        (tmp_path / "bad.json").write_text(bad)
        with pytest.raises(EnvFileError):
            load_env_file(str(tmp_path / "bad.json"))
    with pytest.raises(EnvFileError):
        load_env_file(str(tmp_path / "missing.json"))


def test_os_errors_map_to_path_codes() -> None:
    cases = {
        errno.ENOENT: ErrorCode.PATH_NOT_FOUND,
        errno.EISDIR: ErrorCode.PATH_IS_DIRECTORY,
        errno.ENOTDIR: ErrorCode.PATH_NOT_DIRECTORY,
        errno.EACCES: ErrorCode.PATH_ACCESS_DENIED,
        errno.ENOSPC: ErrorCode.NO_SPACE,
        errno.EDQUOT: ErrorCode.NO_SPACE,
        errno.ENOTEMPTY: ErrorCode.DIRECTORY_NOT_EMPTY,
        errno.EIO: ErrorCode.INTERNAL,
    }
    for number, code in cases.items():
        refusal = path_refusal(OSError(number, os.strerror(number)), "/p")
        assert refusal.code == code
        assert refusal.message.startswith("/p: ")


def test_exit_codes() -> None:
    assert exit_code(0) == 0
    assert exit_code(3 << 8) == 3
    assert exit_code(15) == 143


def test_file_changed_between_passes_is_cut_not_sent(tmp_path: Path) -> None:
    size = 3 * 1024 * 1024  # over SMALL_FILE: streamed in a second pass
    target = tmp_path / "f"
    target.write_bytes(b"a" * size)
    stream = Files(str(tmp_path)).open_read("f")
    assert stream.data is None
    target.write_bytes(b"b" * size)  # same size, other bytes
    sent: list[bytes] = []

    def drain() -> None:
        for chunk in stream:
            sent.append(chunk)

    with pytest.raises(Aborted):
        drain()
    assert sum(map(len, sent)) < size  # the last chunk was held back
    assert stream.fd == -1


def test_large_file_streams_whole_when_unchanged(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"xyz" * 1_000_000)
    stream = Files(str(tmp_path)).open_read("f")
    assert b"".join(stream) == b"xyz" * 1_000_000
    assert stream.length == 3_000_000


def test_trailing_read_is_one_pass_ending_in_the_digest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = b"xyz" * 1_000_000
    (tmp_path / "f").write_bytes(data)
    reads = []
    real_read = os.read

    def counting(fd: int, n: int) -> bytes:
        chunk = real_read(fd, n)
        reads.append(len(chunk))
        return chunk

    monkeypatch.setattr(os, "read", counting)
    stream = Files(str(tmp_path)).open_read("f", trailing=True)
    body = b"".join(stream)
    assert body == data + hashlib.sha256(data).hexdigest().encode()
    assert stream.body_length == len(body)
    assert sum(reads) == len(data)
    assert stream.fd == -1


def test_trailing_read_of_a_file_written_meanwhile_is_cut(tmp_path: Path) -> None:
    size = 3 * 1024 * 1024
    target = tmp_path / "f"
    target.write_bytes(b"a" * size)
    stream = Files(str(tmp_path)).open_read("f", trailing=True)
    sent: list[bytes] = []

    def drain_changing_the_file_after_the_first_chunk() -> None:
        for chunk in stream:
            sent.append(chunk)
            if len(sent) == 1:
                with open(target, "r+b") as f:  # same size, other bytes
                    f.seek(size - 1)
                    f.write(b"b")

    with pytest.raises(Aborted):
        drain_changing_the_file_after_the_first_chunk()
    assert sum(map(len, sent)) == size  # the digest never went out
    assert stream.fd == -1


def test_trailing_read_of_a_small_file_keeps_the_digest_first(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"small")
    stream = Files(str(tmp_path)).open_read("f", trailing=True)
    assert stream.data == b"small"
    assert stream.digest == hashlib.sha256(b"small").hexdigest()
    proc = Files("/").open_read("/proc/self/status", trailing=True)  # size 0 to fstat
    assert proc.data is not None
    assert proc.length == len(proc.data) > 0


def test_small_file_is_served_from_the_first_read(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(b"before")
    stream = Files(str(tmp_path)).open_read("f")
    (tmp_path / "f").write_bytes(b"after!")
    assert stream.data == b"before"
    assert b"".join(stream) == b"before"
    assert stream.fd == -1
    proc = Files("/").open_read("/proc/self/status")  # changes on every read
    assert proc.data is not None
    assert proc.length == len(proc.data)


def test_staged_agent_imports_with_the_bare_interpreter_only(tmp_path: Path) -> None:
    """The agent and every module of it import with -I -S and nothing but
    the staged tree: the standard library, podbay.errors, podbay.wire and podbay.agent."""
    staged = stage(tmp_path / "staged")
    assert sorted(p.name for p in (staged / "podbay").iterdir()) == [
        "__init__.py",
        "__pycache__",
        "agent",
        "errors.py",
        "wire",
    ]
    modules = sorted(p.stem for p in (staged / "podbay" / "agent").glob("*.py"))
    probe = (
        "import sys, importlib\n"
        f"sys.path.insert(0, {str(staged)!r})\n"
        f"for m in {modules!r}: importlib.import_module('podbay.agent.' + m)\n"
        "import podbay.agent.__main__\n"
        "bad = sorted({n.split('.')[0] for n in sys.modules} - set(sys.stdlib_module_names)"
        " - {'podbay', '__main__', 'sitecustomize'})\n"
        "assert not bad, bad\n"
        "extra = sorted(n for n in sys.modules if n.startswith('podbay.')"
        " and not n.startswith(('podbay.errors', 'podbay.wire', 'podbay.agent')))\n"
        "assert not extra, extra\n"
        "print('ok')\n"
    )
    result = subprocess.run(
        [sys.executable, "-I", "-S", "-c", probe],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={},
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "ok\n"
    help_run = subprocess.run(
        agent_argv([sys.executable], staged, "--help"),
        capture_output=True,
        text=True,
        env={},
        check=False,
    )
    assert help_run.returncode == 0
    assert "--fd" in help_run.stdout


def test_cli_forwards_its_options(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[list[str]] = []

    def fake_main(argv: list[str] | None = None) -> int:
        seen.append(list(argv or []))
        return 0

    monkeypatch.setattr("podbay.agent.__main__.main", fake_main)
    from podbay.cli.main import cli

    result = CliRunner().invoke(
        cli, ["agent", "--socket", "/tmp/s.sock", "--workspace", "/w", "--env-file", "/e.json"]
    )
    assert result.exit_code == 0, result.output
    assert seen == [["--socket", "/tmp/s.sock", "--workspace", "/w", "--env-file", "/e.json"]]


def test_docstring_examples() -> None:
    import doctest
    import importlib

    agent = ("__main__", "environment", "files", "reaper", "refusal", "ring")
    for name in [f"podbay.agent.{name}" for name in agent] + ["podbay.runtime.staging"]:
        module = importlib.import_module(name)
        result = doctest.testmod(module)
        assert result.failed == 0, name


def test_command_line_parsing() -> None:
    from podbay.agent.__main__ import UsageError, parse_args

    assert parse_args(["--socket", "/s", "--workspace", "/w"]).workspace == "/w"
    assert parse_args(["--fd", "3", "--guard-uid=65535"]).guard_uid == 65535
    assert parse_args(["--fd", "3", "--oom-fd", "4"]).oom_fd == 4
    for bad in (
        [],
        ["--fd", "x"],
        ["--socket", "/s", "--fd", "3"],
        ["--nope", "1"],
        ["--fd"],
        ["--fd", "3", "--guard-uid", "-1"],
    ):
        with pytest.raises(UsageError):
            parse_args(bad)


def test_signals_ignored_by_the_agents_launcher_reach_commands_at_their_default() -> None:
    # A suite or a shell that starts the agent in the background ignores
    # SIGINT and SIGQUIT; a command must not inherit that (kill -QUIT did nothing).
    import subprocess
    import sys

    script = (
        "import signal, subprocess\n"
        "for s in (signal.SIGQUIT, signal.SIGHUP, signal.SIGUSR1):\n"
        "    signal.signal(s, signal.SIG_IGN)\n"
        "from podbay.agent.__main__ import restore_default_dispositions\n"
        "restore_default_dispositions()\n"
        "child = subprocess.run(['sh', '-c', 'kill -QUIT $$; echo survived'],"
        " capture_output=True, text=True)\n"
        "print(child.returncode, repr(child.stdout))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "-3 ''", out
