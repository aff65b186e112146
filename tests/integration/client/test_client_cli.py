"""``podbay sandbox ...`` as a subprocess: exit codes, --json, one-line errors."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.root


def unsigned_token(iss: str) -> str:
    """An identity token the client can read its server from (``iss``), which no
    server accepts: enough to point the client somewhere."""

    def part(obj: dict[str, str]) -> str:
        return base64.urlsafe_b64encode(json.dumps(obj).encode()).decode().rstrip("=")

    return f"{part({'alg': 'none', 'typ': 'JWT'})}.{part({'iss': iss, 'sub': 'nobody'})}.c2ln"


@pytest.fixture
def cli(platform: Any) -> Any:
    def run(
        *args: str, token: str | None = None, check: bool = False
    ) -> subprocess.CompletedProcess[str]:
        env = {**os.environ, "ASTRO_AUTHZ_TOKEN": token or platform.token}
        env.pop("PODBAY_SERVER_URL", None)
        done = subprocess.run(
            [sys.executable, "-m", "podbay.cli.main", "sandbox", *args],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
        if check:
            assert done.returncode == 0, done.stderr
        return done

    return run


def test_exec_exits_with_the_commands_code(cli: Any, name: str) -> None:
    done = cli("exec", name, "--", "/bin/sh", "-c", "echo out; echo err >&2; exit 7")
    assert (done.returncode, done.stdout, done.stderr) == (7, "out\n", "err\n")
    done = cli("exec", name, "--json", "--", "echo", "hi")
    assert done.returncode == 0
    assert json.loads(done.stdout)["stdout"] == "hi\n"


def test_run_streams_and_exits_with_the_code(cli: Any, name: str) -> None:
    done = cli(
        "run",
        name,
        "--interval-ms",
        "50",
        "--",
        "/bin/sh",
        "-c",
        "echo a; sleep 0.2; echo b >&2; exit 3",
    )
    assert (done.returncode, done.stdout, done.stderr) == (3, "a\n", "b\n")


def test_lifecycle_and_json(cli: Any, name: str) -> None:
    attached = json.loads(cli("attach", name, "--json", check=True).stdout)
    assert attached["name"] == name
    assert "headers" not in attached
    # `class` is the caller's word ("default": none given) on podbay and the
    # reference stub alike; podbay adds the class that runs (runtime_class).
    assert attached["class"] == "default"
    got = json.loads(cli("get", name, "--json", check=True).stdout)
    assert got["class"] == "default"
    assert got.get("runtime_class") == attached.get("runtime_class")
    rows = json.loads(cli("list", "--json", check=True).stdout)
    assert name in [r["name"] for r in rows]
    assert name in cli("list", check=True).stdout
    spawned = cli("exec", name, "--", "true", check=True)
    assert spawned.stdout == ""
    cli("stop", name, check=True)
    cli("rm", name, check=True)
    missing = cli("get", name)
    assert missing.returncode == 1
    assert missing.stderr.startswith("podbay: 404 SANDBOX_NOT_FOUND:")
    assert len(missing.stderr.strip().splitlines()) == 1
    assert "Traceback" not in missing.stderr


def test_ps_and_kill(cli: Any, name: str, platform: Any) -> None:
    from podbay import SandboxClient

    with SandboxClient(identity_token=platform.token, server_url=platform.url) as client:
        proc = client.spawn(name, ["sleep", "30"])
    listed = json.loads(cli("ps", name, "--json", check=True).stdout)
    assert [p["process_id"] for p in listed] == [proc.process_id]
    assert proc.process_id in cli("ps", name, check=True).stdout
    cli("kill", name, proc.process_id, check=True)
    assert json.loads(cli("ps", name, "--json", check=True).stdout) == []
    gone = cli("kill", name, proc.process_id)
    assert gone.returncode == 1
    assert "404" in gone.stderr


def test_cp_and_ls(cli: Any, name: str, tmp_path: Path) -> None:
    data = bytes(range(256)) * 100 + b"\x00\xff"
    (tmp_path / "f.bin").write_bytes(data)
    (tmp_path / "dir" / "sub").mkdir(parents=True)
    (tmp_path / "dir" / "sub" / "x.txt").write_text("x")
    cli("cp", str(tmp_path / "f.bin"), f"{name}:f.bin", check=True)
    cli("cp", str(tmp_path / "dir"), f"{name}:tree", check=True)
    listing = cli("ls", name, check=True).stdout.split()
    assert "f.bin" in listing
    assert "tree/" in listing
    entries = json.loads(cli("ls", name, "tree", "--json", check=True).stdout)
    assert entries == [{"name": "sub", "is_directory": True}]
    cli("cp", f"{name}:f.bin", str(tmp_path / "back.bin"), check=True)
    assert (tmp_path / "back.bin").read_bytes() == data
    cli("cp", f"{name}:tree", str(tmp_path / "tree-back"), check=True)
    assert (tmp_path / "tree-back" / "sub" / "x.txt").read_text() == "x"
    bad = cli("cp", str(tmp_path / "f.bin"), str(tmp_path / "g.bin"))
    assert bad.returncode == 2
    assert bad.stderr.startswith("podbay: ")
    missing = cli("cp", f"{name}:nope.bin", str(tmp_path / "n"))
    assert missing.returncode == 1
    assert "404" in missing.stderr


def test_unreachable_and_no_token(cli: Any) -> None:
    down = cli("list", token=unsigned_token("http://127.0.0.1:9"))
    assert down.returncode == 2
    assert down.stderr.startswith("podbay: unavailable:")
    assert "Traceback" not in down.stderr
    env = {k: v for k, v in os.environ.items() if k != "ASTRO_AUTHZ_TOKEN"}
    none = subprocess.run(
        [sys.executable, "-m", "podbay.cli.main", "sandbox", "list"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert none.returncode == 2
    assert "ASTRO_AUTHZ_TOKEN" in none.stderr


#: The full command's modules, then what the quick path does without while
#: the command runs (json, socket, re, the idna codec: a CLI start's heaviest
#: standard modules), but loads to report a refusal (podbay.errors).
QUICK_UNLOADED = ("click", "httpx", "json", "socket", "re", "encodings.idna", "podbay.errors")
QUICK = (
    "import atexit, sys; marker = sys.argv.pop(1); "
    "atexit.register(lambda: open(marker, 'w').write(' '.join("
    f"m for m in {QUICK_UNLOADED!r} if m in sys.modules))); "
    "from podbay.cli.entry import main; main()"
)


def test_quick_exec_answers_as_the_full_command(platform: Any, name: str, tmp_path: Path) -> None:
    # `podbay sandbox exec` starts without click or httpx when it can; what it
    # prints and its exit code are the full command's, byte for byte.
    env = {**os.environ, "ASTRO_AUTHZ_TOKEN": platform.token}
    env.pop("PODBAY_SERVER_URL", None)
    marker = tmp_path / "loaded"

    def one(argv: list[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)

    def both(*args: str) -> tuple[Any, Any, str]:
        quick = [sys.executable, "-c", QUICK, str(marker), "sandbox", "exec", *args]
        full = [sys.executable, "-m", "podbay.cli.main", "sandbox", "exec", *args]
        if not marker.exists():  # the first: the quick path makes the sandbox
            return one(quick), one(full), marker.read_text()
        # Then side by side: two processes' start-up is most of each call.
        with ThreadPoolExecutor(2) as pool:
            answers = list(pool.map(one, [quick, full]))
        return answers[0], answers[1], marker.read_text()

    for args in (
        [name, "--", "/bin/sh", "-c", "echo out; echo err >&2; exit 7"],
        [
            name,
            "--cwd",
            "/tmp",
            "--env",
            "A=1",
            "--env=B=2",
            "--",
            "/bin/sh",
            "-c",
            "pwd; echo $A$B",
        ],
        [name, "--timeout-ms", "300", "--", "sleep", "5"],
        [name, "--cwd", "/nonexistent", "--", "true"],
        [name, "--", "/no/such/program"],
        ["bad name!", "--", "true"],
        [name, "--server", platform.url, "--", "printf", "\u00e9\\377"],
    ):
        quick, full, loaded = both(*args)
        assert (quick.returncode, quick.stdout, quick.stderr) == (
            full.returncode,
            full.stdout,
            full.stderr,
        ), args
        if args[0] == name:  # the quick path answered by itself
            refused = "/nonexistent" in args or "/no/such/program" in args
            assert loaded == "" or (refused and not {"click", "httpx"} & set(loaded.split())), (
                args,
                loaded,
            )
    quick, full, loaded = both(name, "--json", "--", "echo", "hi")
    assert loaded.startswith("click httpx")  # handed over
    assert json.loads(quick.stdout)["stdout"] == json.loads(full.stdout)["stdout"] == "hi\n"
    env["ASTRO_AUTHZ_TOKEN"] = unsigned_token("http://127.0.0.1:9")
    quick, full, _ = both(name, "--", "true")
    assert quick.returncode == full.returncode == 2
    assert quick.stderr == full.stderr
    assert quick.stderr.startswith("podbay: unavailable:")
