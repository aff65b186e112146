"""What the runtime copies into a sandbox to run the agent, and how it starts it.

Used on the host (runtime drivers, tests), never by the running agent. The
staged tree holds exactly ``podbay/__init__.py`` (an empty stub, so nothing
of the client is imported), ``podbay/errors.py``, ``podbay/wire/`` and
``podbay/agent/`` (:func:`staged_files`); it is
mounted read-only and run with the image's bare interpreter in isolated mode
(``-I -S``: no site-packages, no user environment), so whatever the sandbox's
user does to its own Python cannot touch the agent.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from podbay.errors import DriverError

#: Sub-packages and modules the agent needs, relative to the ``podbay`` package.
STAGED_PACKAGES = ("wire", "agent")
STAGED_MODULES = ("errors.py",)
#: The staged package's ``__init__``: empty, so nothing of the client is imported.
STUB_INIT = '"""podbay, as staged for the sandbox agent."""\n'


def source_root() -> Path:
    """The installed ``podbay`` package directory the agent is staged from."""
    return Path(__file__).resolve().parent.parent


def staged_files(root: Path | None = None) -> list[tuple[str, Path]]:
    """(path inside the staged ``podbay/``, source file) for every staged file, sorted."""
    root = root or source_root()
    files = [(name, root / name) for name in STAGED_MODULES]
    for package in STAGED_PACKAGES:
        files += [
            (str(path.relative_to(root)), path)
            for path in sorted((root / package).rglob("*.py"))
            if "__pycache__" not in path.parts
        ]
    return sorted(files)


def launch_code(staged: str | os.PathLike[str]) -> str:
    """The ``python -c`` program that runs the agent staged at ``staged``."""
    return (
        f"import sys; sys.path.insert(0, {os.fspath(staged)!r}); "
        "from podbay.agent.__main__ import main; sys.exit(main())"
    )


#: The environment to start the agent with (commands never see it: they get a
#: clean one). glibc's malloc otherwise raises its mmap threshold after the
#: first large buffer is freed and keeps every later one on the heap, so RSS
#: after a burst of 1 MiB outputs stayed ~10 MiB higher (measured: 32 vs 23 MiB
#: after a mixed load, peak 43 vs 28 MiB). Glibc reads these at start-up only.
AGENT_ENV: dict[str, str] = {
    "MALLOC_MMAP_THRESHOLD_": "131072",
    "MALLOC_ARENA_MAX": "2",
    "LANG": "C.UTF-8",
}


def stage(parent: str | os.PathLike[str], *, python: Sequence[str] = (sys.executable,)) -> Path:
    """The agent's code staged under ``parent/<content hash>/`` (made if missing);
    returns that directory, the agent's ``sys.path`` entry.

    Byte-compiled by ``python`` (the interpreter that will run the agent,
    whose version may differ from the host's) into unchecked-hash ``.pyc``:
    the copy is mounted read-only, and compiling at every start costs tens of
    ms. A new podbay version stages a new directory; running sandboxes keep
    theirs. Concurrent stagers each build a private copy; the first rename wins.
    """
    root = source_root()
    files = staged_files(root)
    if not (root / "agent" / "__main__.py").exists():
        raise DriverError(f"the agent is missing from the installed podbay ({root}/agent)")
    digest = hashlib.sha256()
    for rel, path in files:
        digest.update(rel.encode() + b"\0" + path.read_bytes() + b"\0")
    target = Path(parent) / digest.hexdigest()[:16]
    if (target / "complete").exists():
        return target
    tmp = target.with_name(f".{target.name}.{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    package = tmp / "podbay"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(STUB_INIT)
    for rel, path in files:
        dest = package / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, dest)
    argv = [
        *python,
        "-I",
        "-S",
        "-m",
        "compileall",
        "-q",
        "--invalidation-mode",
        "unchecked-hash",
        str(package),
    ]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        raise DriverError(f"the agent's code does not compile: {done.stdout}{done.stderr}")
    for dirpath, _, filenames in os.walk(tmp):
        os.chmod(dirpath, 0o755)  # noqa: S103 - read-only code, readable by all
        for name in filenames:
            os.chmod(os.path.join(dirpath, name), 0o644)
    (tmp / "complete").write_text("")
    try:
        os.rename(tmp, target)
    except OSError:  # staged concurrently by another process: theirs is as good
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def agent_argv(python: Sequence[str], staged: str | os.PathLike[str], *options: str) -> list[str]:
    """The command line that starts the agent staged at ``staged`` with ``python``
    (an interpreter's path, or a loader's command line ending with one).

    >>> agent_argv(["python3.11"], "/opt/podbay", "--fd", "3")[:3]
    ['python3.11', '-I', '-S']
    """
    return [*python, "-I", "-S", "-c", launch_code(staged), *options]
