"""The staged agent starts from one bundle file; without a usable one, from its files."""

from __future__ import annotations

import marshal
import subprocess
import sys
from pathlib import Path

import pytest

from podbay.runtime.staging import BUNDLE, START_AGENT, launch_code, stage

# Replaces the start of the agent in the start-up program: report instead.
REPORT = (
    "import podbay.agent.__main__\n"
    "bundled = sorted(n for n, m in list(sys.modules.items())"
    " if getattr(getattr(m, '__loader__', None), '__name__', '') == 'Bundled')\n"
    "import podbay.agent.app as app\n"
    "print(len(bundled), 'podbay.agent.app' in bundled, 'json' in bundled, app.__file__,"
    " podbay.agent.__path__[0])\n"
)


@pytest.fixture(scope="module")
def staged(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return stage(tmp_path_factory.mktemp("staged"))


def report(
    staged: Path, instead: str = REPORT, *, part: str = START_AGENT, options: tuple[str, ...] = ()
) -> list[str]:
    """What the start-up program, run with ``options``, prints with ``part`` of it
    replaced by ``instead``."""
    program = launch_code(staged).replace(part, instead)
    assert program != launch_code(staged)
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-c", program, *options],
        capture_output=True,
        text=True,
        env={},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_the_agent_imports_from_its_bundle(staged: Path) -> None:
    count, own, stdlib, app_file, package_dir = report(staged)
    # Its own modules and the standard library's pure-Python ones, with the
    # paths they have on disk (so modules imported later are found beside them).
    assert int(count) > 40
    assert own == "True"
    assert stdlib == "True"
    assert app_file == str(staged / "podbay" / "agent" / "app.py")
    assert package_dir == str(staged / "podbay" / "agent")


def test_a_bundle_of_another_interpreter_is_ignored(staged: Path, tmp_path: Path) -> None:
    """An image with another Python shares the staged code: its start must not
    run code objects compiled for a different version."""
    copy = tmp_path / "copy"
    subprocess.run(["cp", "-a", str(staged), str(copy)], check=True)
    data = (copy / BUNDLE).read_bytes()
    size = int.from_bytes(data[:8], "little")
    kind, _, width, *tables = marshal.loads(data[8 : 8 + size])
    head = marshal.dumps((kind, "2.7.18 (elsewhere)", width, *tables))
    (copy / BUNDLE).write_bytes(len(head).to_bytes(8, "little") + head + data[8 + size :])
    count, own, *_ = report(copy)
    assert (count, own) == ("0", "False")
    (copy / BUNDLE).write_bytes(b"not marshal data")
    assert report(copy)[:2] == ["0", "False"]
    (copy / BUNDLE).unlink()
    assert report(copy)[:2] == ["0", "False"]


# Replaces the start of the agent: which dataclass methods ran kept code, then
# whether the bundle lets go of ``dataclasses`` and its buffer once released.
KEPT = """
import dataclasses
kept = dataclasses.__dict__.get("exec")
served = []
if kept is not None:
    def counting(source, globals=None, locals=None, /):
        served.append(source)
        return kept(source, globals, locals)
    dataclasses.exec = counting
import podbay.agent.__main__
from podbay.wire.data import ExecRequest
request = ExecRequest(command=["true"])
try:
    request.cwd = "/"
    frozen = False
except dataclasses.FrozenInstanceError:
    frozen = True
print(kept is not None, len(served), request == ExecRequest(command=["true"]), frozen)
_release()
finder = any(getattr(f, "__name__", "") == "Bundled" for f in sys.meta_path)
print("exec" in dataclasses.__dict__, finder)
"""


def test_dataclass_methods_run_kept_code(staged: Path) -> None:
    """dataclasses compiles each generated method (a third of the agent's start-up
    CPU); the bundle keeps their code, and the classes behave as compiled ones."""
    installed, served, equal, frozen, still_installed, finder = report(staged, KEPT)
    assert installed == "True"
    assert int(served) > 50
    assert (equal, frozen) == ("True", "True")
    assert (still_installed, finder) == ("False", "False")


# Replaces the start of the agent: what start-up left out, and that it still works.
DEFERRED = """
import podbay.agent.__main__
_release()
loaded = sorted(n for n in ("inspect", "ast", "dis", "tokenize") if n in sys.modules
                and type(sys.modules[n]).__name__ != "Deferred")
print(",".join(loaded) or "-")
import inspect
from podbay.wire.data import ExecRequest
print(inspect.signature(ExecRequest).parameters["command"].kind.name, "ast" in sys.modules)
"""


def test_start_up_leaves_inspect_until_it_is_used(staged: Path) -> None:
    """dataclasses imports inspect (and ast, dis, tokenize: a sixth of the start-up's
    CPU) only to describe a class without a docstring: a dataclass the agent
    imports at start-up without one brings it back. Used later, it loads."""
    loaded, kind, ast_loaded = report(staged, DEFERRED)
    assert loaded == "-"
    assert (kind, ast_loaded) == ("KEYWORD_ONLY", "True")


# Replaces the start of the agent: how many times importing it took a lock (each
# acquire reads the clock: a trap in a fresh gVisor sandbox), and whether the
# import system locks again once released.
LOCKS = """
import _thread, _imp
boot = sys.modules["_frozen_importlib"]
taken = []
real_allocate = boot._thread.allocate_lock
class Counted:
    def __init__(self):
        self.lock = real_allocate()
    def acquire(self, *args, **kwargs):
        taken.append(1)
        return self.lock.acquire(*args, **kwargs)
    def release(self):
        return self.lock.release()
    def __enter__(self):
        return self.acquire()
    def __exit__(self, *exc):
        self.release()
boot._thread = type(sys)("counted_thread")
boot._thread.__dict__.update(_thread.__dict__)
boot._thread.allocate_lock = Counted
real_acquire = _imp.acquire_lock
def counted_acquire():
    taken.append(1)
    return real_acquire()
boot._imp = type(sys)("counted_imp")
boot._imp.__dict__.update(_imp.__dict__)
boot._imp.acquire_lock = counted_acquire
import podbay.agent.__main__
during = len(taken)
_release()
import colorsys  # not one the agent imports
print(during, len(taken) > during)
"""


def test_importing_the_agent_takes_no_import_locks(staged: Path) -> None:
    """Nothing else runs while the agent is imported: importlib's locks (two or
    more per module, each a clock read that a fresh gVisor sandbox traps) are
    left out then, and back once the agent is imported."""
    during, locked_after = report(staged, LOCKS)
    assert int(during) == 0
    assert locked_after == "True"


# The same start on an interpreter whose importlib lacks one of the internals the
# start leaves out (another CPython): the agent is still imported, with locks.
WITHOUT_INTERNAL = """
import podbay.agent.__main__
_release()
print(sys.modules["_frozen_importlib"]._ModuleLockManager.__name__)
"""


def test_an_interpreter_without_those_internals_keeps_its_locks(staged: Path) -> None:
    original = launch_code(staged)
    program = original.replace('"_ImportLockContext")', '"_NotInThisPython")')
    assert program != original
    done = subprocess.run(
        [sys.executable, "-I", "-S", "-c", program.replace(START_AGENT, WITHOUT_INTERNAL)],
        capture_output=True,
        text=True,
        env={},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["_ModuleLockManager"]


# Replaces only the agent's run at the end of the start-up program: what the
# start made ready, and what it left for the first request that needs it.
STARTED = """
late = getattr(sys.modules.get("ctypes"), "__loader__", None)
print(gc.isenabled(), gc.get_freeze_count() > 1000, getattr(late, "__name__", "-"),
      ",".join(sorted({"termios", "urllib.parse", "ipaddress"} & set(sys.modules))) or "-")
"""
RUN = "sys.exit(main())\n"


def test_the_start_leaves_for_later_what_the_first_answer_does_not_need(staged: Path) -> None:
    """Between the import and the first answer: no traversal of everything the
    import made (frozen), no extension module or urllib.parse that only a
    terminal or a query string needs, no ctypes without the guard."""
    assert report(staged, STARTED, part=RUN, options=("--fd", "3")) == ["True", "True", "-", "-"]


def test_the_guards_ctypes_comes_from_the_bundle(staged: Path) -> None:
    """Under gVisor the guard imports ctypes between bind and the first answer:
    from the bundle (one file already read), not from ~25 lookups and files."""
    guarded = ("--socket", "/s", "--guard-uid", "1")
    assert report(staged, STARTED, part=RUN, options=guarded) == ["True", "True", "Bundled", "-"]
