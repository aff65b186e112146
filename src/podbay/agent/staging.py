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

import os
import shutil
from pathlib import Path

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
        files += [(str(path.relative_to(root)), path)
                  for path in sorted((root / package).rglob("*.py"))
                  if "__pycache__" not in path.parts]
    return sorted(files)


def launch_code(staged: str | os.PathLike[str]) -> str:
    """The ``python -c`` program that runs the agent staged at ``staged``."""
    return (f"import sys; sys.path.insert(0, {os.fspath(staged)!r}); "
            "from podbay.agent.__main__ import main; sys.exit(main())")

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


def stage(dest: str | os.PathLike[str], *, compile_bytecode: bool = True) -> Path:
    """Copy the agent's code under ``dest``; returns the ``sys.path`` entry.

    ``compile_bytecode`` writes ``__pycache__`` now, because the mount is
    read-only and compiling at every sandbox start costs tens of ms. (Only
    useful when the host's Python minor version is the image's.)
    """
    root = Path(dest)
    package = root / "podbay"
    for name in STAGED_PACKAGES:
        shutil.rmtree(package / name, ignore_errors=True)
    package.mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text(STUB_INIT)
    for rel, path in staged_files():
        (package / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, package / rel)
    if compile_bytecode:
        import compileall

        compileall.compile_dir(package, quiet=1)
    return root


def agent_argv(python: str, staged: str | os.PathLike[str], *options: str) -> list[str]:
    """The command line that starts the staged agent with ``python``.

    >>> agent_argv("python3.11", "/opt/podbay", "--fd", "3")[:3]
    ['python3.11', '-I', '-S']
    """
    return [python, "-I", "-S", "-c", launch_code(staged), *options]
