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
import secrets
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


#: The staged file holding the compiled code of every pure-Python module the
#: agent imports at start-up (its own and the standard library's), see
#: :func:`build_bundle`.
BUNDLE = "agent.bundle"

# Part of both programs below: ``inspect`` (with ast, dis and tokenize, a sixth
# of the start-up's CPU) is imported by ``dataclasses`` only to describe a class
# without a docstring, which no class the agent imports at start-up is (a test
# pins it). So ``sys.modules`` first holds a stand-in that imports the real module
# when an attribute it lacks is read, and takes on its contents. (The standard
# library's LazyLoader does not fit: on 3.11 the ``import`` statement itself
# reads the module's ``__spec__``, which loads it.)
_DEFER_INSPECT = """
def _defer(name):
    class Deferred(type(sys)):
        def __getattr__(self, attr):
            del sys.modules[name]
            real = __import__(name)
            self.__dict__.update(real.__dict__)
            return getattr(real, attr)

    sys.modules[name] = Deferred(name)
"""

#: Modules the agent imports only in ``main()``, when it is started with an
#: option: the guard's ``ctypes`` under gVisor (``--guard-uid``), between its
#: socket's ``bind`` and its first answer. They are kept in the bundle too, and
#: imported from it, before it is dropped, when the option is given: from their
#: files they cost ~25 trapped system calls (lookups along ``sys.path``, a
#: directory listing, two ``.pyc`` files) on the path to readiness.
LATE_IMPORTS: tuple[tuple[str, str], ...] = (("--guard-uid", "ctypes"),)

# Run by the interpreter that will run the agent (argv: staged dir, output file).
# It imports the agent as a start does and keeps, for every module that came from
# a ``.py`` file, where it was found (an index into sys.path and the path below
# it) and its marshalled code. ``-I -S`` gives the same sys.path at build and at
# start. It also keeps the code of every method source ``dataclasses`` generates
# meanwhile (it compiles each with ``exec``: about a third of the start-up's CPU),
# by that source. The file: the table's length (8 bytes), the table, the code blobs.
_BUILD_BUNDLE = (
    f"""
import marshal, sys
LATE_IMPORTS = {LATE_IMPORTS!r}
staged, out = sys.argv[1], sys.argv[2]
sys.path.insert(0, staged)
roots = sorted(enumerate(sys.path), key=lambda entry: -len(entry[1]))
before = set(sys.modules)
"""
    + _DEFER_INSPECT
    + """
_defer("inspect")
import dataclasses
table, texts, blobs, offset = {}, {}, [], 0
def add(blob):
    global offset
    blobs.append(blob)
    offset += len(blob)
    return offset - len(blob), len(blob)
def record(source, globals=None, locals=None, /):
    if isinstance(source, str) and source not in texts:
        # As exec compiles it there: dataclasses.py has no __future__ imports.
        code = compile(source, "<string>", "exec", dont_inherit=True)
        texts[source] = add(marshal.dumps(code))
    return exec(source, globals, locals)
dataclasses.exec = record
import podbay.agent.__main__
del dataclasses.exec
for _, late in LATE_IMPORTS:
    __import__(late)
for name in sorted(set(sys.modules) - before):
    spec = getattr(sys.modules[name], "__spec__", None)
    origin = getattr(spec, "origin", None)
    if spec is None or not isinstance(origin, str) or not origin.endswith(".py"):
        continue  # built in, frozen or an extension module: found as usual
    for index, root in roots:
        if origin.startswith(root + "/"):
            rel = origin[len(root) + 1 :]
            break
    else:
        continue
    with open(origin, "rb") as f:
        blob = marshal.dumps(compile(f.read(), rel, "exec", dont_inherit=True))
    package = spec.submodule_search_locations is not None
    table[name] = (index, rel, package, *add(blob))
head = marshal.dumps(("podbay-bundle-2", sys.version, len(sys.path), table, texts))
with open(out, "wb") as f:
    f.write(len(head).to_bytes(8, "little") + head + b"".join(blobs))
"""
)

# Part of the start-up program: when the bundle was made by this very interpreter
# (same version, same sys.path shape), a finder first on sys.meta_path serves
# those modules from it. Anything else (an older bundle, none, a module imported
# later) is found on sys.path as before. A module's code is unmarshalled when it
# is imported, from the file's one buffer, dropped once the agent is imported (the
# function returned): all at once, they raised the agent's resident memory for
# good (~0.5 MiB). Until then, ``dataclasses`` runs the kept code of a method
# source it generates instead of compiling that source again (the same source
# compiles to the same code).
_USE_BUNDLE = """
def _bundled(path):
    import marshal
    try:
        with open(path, "rb") as f:
            data = f.read()
        size = int.from_bytes(data[:8], "little")
        kind, version, width, modules, texts = marshal.loads(data[8 : 8 + size])
    except (OSError, ValueError, EOFError, TypeError):
        return lambda: None
    if (kind, version, width) != ("podbay-bundle-2", sys.version, len(sys.path)):
        return lambda: None
    roots, spec_type, blobs = list(sys.path), type(sys.__spec__), [data, 8 + size]

    def code_at(offset, length):
        data, base = blobs
        with memoryview(data) as view:
            return marshal.loads(view[base + offset : base + offset + length])

    class Bundled:
        @classmethod
        def find_spec(cls, name, path=None, target=None):
            entry = modules.get(name)
            if entry is None:
                return None
            origin = roots[entry[0]] + "/" + entry[1]
            spec = spec_type(name, cls, origin=origin, is_package=entry[2])
            if entry[2]:
                spec.submodule_search_locations = [origin.rpartition("/")[0]]
            spec.has_location = True
            return spec

        @staticmethod
        def create_module(spec):
            return None

        @staticmethod
        def exec_module(module):
            _, _, _, offset, length = modules.pop(module.__spec__.name)
            exec(code_at(offset, length), module.__dict__)

    def exec_kept(source, globals=None, locals=None, /):
        entry = texts.get(source) if isinstance(source, str) else None
        return exec(source if entry is None else code_at(*entry), globals, locals)

    # Under gVisor a fresh sandbox's clock_gettime calls are system calls (its vDSO
    # is not ready yet) and CPython 3.11 reads the clock at every lock acquire:
    # importlib's per-module and per-finder locks were ~600 traps of a start-up's
    # ~1050. Nothing else runs while the agent is imported, so they are left out
    # until release().
    # These are CPython internals: an interpreter without any of them (another
    # version in another image) keeps its locks and starts as before.
    boot = sys.modules["_frozen_importlib"]
    names = ("_ModuleLockManager", "_lock_unlock_module", "_ImportLockContext")
    locking = [getattr(boot, name, None) for name in names]
    if None in locking:
        locking = None

    class Unlocked:
        def __init__(self, name=None):
            pass

        def __enter__(self):
            pass

        def __exit__(self, *exc):
            pass

    def release():
        if locking is not None:
            boot._ModuleLockManager, boot._lock_unlock_module, boot._ImportLockContext = locking
        sys.meta_path.remove(Bundled)
        modules.clear()
        texts.clear()
        blobs[0] = b""
        if sys.modules.get("dataclasses") is not None:
            sys.modules["dataclasses"].__dict__.pop("exec", None)

    sys.meta_path.insert(0, Bundled)
    if locking is not None:
        boot._ModuleLockManager, boot._ImportLockContext = Unlocked, Unlocked
        boot._lock_unlock_module = lambda name: None
    if "inspect" not in modules:  # deferred at build time too (never imported there)
        _defer("inspect")
    if texts and "dataclasses" in modules:
        import dataclasses

        dataclasses.exec = exec_kept
    return release
"""


def launch_code(staged: str | os.PathLike[str]) -> str:
    """The ``python -c`` program that runs the agent staged at ``staged``.

    Its modules come from the staged :data:`BUNDLE` (one file) rather than a
    hundred files: under gVisor every file the agent opens at start-up costs a
    round trip to the gofer and many trapped system calls."""
    staged = os.fspath(staged)
    # No garbage collection while importing: nearly every object made lives on,
    # so collecting meanwhile is wasted work.
    return (
        f"import gc, sys\ngc.disable()\nsys.path.insert(0, {staged!r})\n"
        f"{_DEFER_INSPECT}{_USE_BUNDLE}"
        f"_release = _bundled({staged + '/' + BUNDLE!r})\n"
        f"{START_AGENT}"
    )


#: The end of :func:`launch_code`: import the agent (and the :data:`LATE_IMPORTS`
#: its options call for), drop the bundle, run it. What the import made lives on,
#: so it is moved out of the collector's sight (``gc.freeze``) before collection
#: resumes: otherwise the first allocation after ``gc.enable()`` traversed all of
#: it (every object made with the collector off counts towards its first
#: collection), delaying the socket's ``bind``, and later collections went
#: through it again.
START_AGENT = (
    "from podbay.agent.__main__ import main\n"
    f"for _option, _module in {LATE_IMPORTS!r}:\n"
    "    if _option in sys.argv[1:]:\n"
    "        __import__(_module)\n"
    "_release()\ngc.freeze()\ngc.enable()\nsys.exit(main())\n"
)


#: The environment to start the agent with (commands never see it: they get a
#: clean one). glibc's malloc otherwise raises its mmap threshold after the
#: first large buffer is freed and keeps every later one on the heap, so RSS
#: after a burst of large outputs stayed high (docs/performance.md). Glibc reads
#: these at start-up only.
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
    # Each stager its own: the drivers of a server's classes stage side by side
    # in one process (a pid alone let one's rmtree pull another's tree away).
    tmp = target.with_name(f".{target.name}.{os.getpid()}.{secrets.token_hex(4)}")
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
    try:
        build_bundle(tmp, python)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
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


def build_bundle(staged: Path, python: Sequence[str]) -> None:
    """Write ``staged/``:data:`BUNDLE` with ``python`` (the agent's interpreter)."""
    argv = [*python, "-I", "-S", "-c", _BUILD_BUNDLE, str(staged), str(staged / BUNDLE)]
    done = subprocess.run(argv, capture_output=True, text=True, check=False, env={})
    if done.returncode != 0:
        raise DriverError(f"cannot bundle the agent's modules: {done.stderr.strip()[-2000:]}")


def agent_argv(python: Sequence[str], staged: str | os.PathLike[str], *options: str) -> list[str]:
    """The command line that starts the agent staged at ``staged`` with ``python``
    (an interpreter's path, or a loader's command line ending with one).

    >>> agent_argv(["python3.11"], "/opt/podbay", "--fd", "3")[:3]
    ['python3.11', '-I', '-S']
    """
    return [*python, "-I", "-S", "-c", launch_code(staged), *options]
