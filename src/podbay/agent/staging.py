"""What the runtime copies into a sandbox to run the agent, and how it starts it.

Used on the host (runtime drivers, tests), never by the running agent. The
staged tree holds exactly ``podbay/__init__.py`` (an empty stub, so nothing
of the client is imported), ``podbay/wire/`` and ``podbay/agent/``; it is
mounted read-only and run with the image's bare interpreter in isolated mode
(``-I -S``: no site-packages, no user environment), so whatever the sandbox's
user does to its own Python cannot touch the agent.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

#: Sub-packages the agent needs, relative to the ``podbay`` package.
STAGED_PACKAGES = ("wire", "agent")

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
    package.mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text('"""podbay, as staged for the sandbox agent."""\n')
    source = Path(__file__).resolve().parent.parent
    for name in STAGED_PACKAGES:
        target = package / name
        if target.exists():
            shutil.rmtree(target)
        shutil.copytree(source / name, target,
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    if compile_bytecode:
        import compileall

        compileall.compile_dir(package, quiet=1)
    return root


def agent_argv(python: str, staged: str | os.PathLike[str], *options: str) -> list[str]:
    """The command line that starts the staged agent with ``python``.

    >>> agent_argv("python3.11", "/opt/podbay", "--fd", "3")[:3]
    ['python3.11', '-I', '-S']
    """
    code = (f"import sys; sys.path.insert(0, {os.fspath(staged)!r}); "
            "from podbay.agent.__main__ import main; sys.exit(main())")
    return [python, "-I", "-S", "-c", code, *options]
