"""Stage the agent's code where every sandbox can run it read-only.

The agent is stdlib-only. Its files (what :func:`podbay.agent.staging.staged_files`
names, under an empty ``podbay/__init__.py``) are copied from the installed podbay
package to ``<data>/agent/<content hash>/`` and byte-compiled there (unchecked
hash ``.pyc``, so the read-only copy never needs writing), then bound
read-only into each sandbox at :data:`AGENT_DIR`. A new podbay version stages
a new directory; running sandboxes keep theirs.

The agent runs on the *pristine* base image's interpreter, through the
image's own dynamic loader with the library cache ignored, so nothing a user
does to ``/usr``, ``/lib`` or ``ld.so.cache`` in their overlay reaches it
(see :func:`agent_argv`).
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
from pathlib import Path

from podbay.agent import staging

from ..base import DriverError

log = logging.getLogger("podbay.runtime.agent")

#: Where, inside a sandbox, the pristine image and the agent's code are bound.
IMAGE_DIR = "/.podbay/image"
AGENT_DIR = "/.podbay/agent"
ENV_FILE = "/.podbay/env.json"
#: The image's dynamic loader, as an execute-only file owned by host root (see
#: :func:`stage_loader`); the agent is started through it.
LOADER = "/.podbay/loader"
#: Its copy on the host, next to the image's rootfs.
LOADER_COPY = "agent-loader"

def _sources(root: Path) -> list[tuple[str, Path]]:
    """(relative path inside the staged ``podbay/``, source file), sorted."""
    files = staging.staged_files(root)
    if not (root / "agent" / "__main__.py").exists():
        raise DriverError(f"the agent is missing from the installed podbay ({root}/agent)")
    return files


def stage_agent(data_dir: Path, image_rootfs: Path) -> Path:
    """The staged agent directory for the installed podbay (created if missing).

    Byte-compiled by the image's own interpreter, whose version may differ
    from the host's."""
    root = staging.source_root()
    files = _sources(root)
    digest = hashlib.sha256()
    for rel, path in files:
        digest.update(rel.encode() + b"\0" + path.read_bytes() + b"\0")
    target = data_dir / "agent" / digest.hexdigest()[:16]
    if (target / "complete").exists():
        return target
    tmp = target.with_name(f".{target.name}.{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    package = tmp / "podbay"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(staging.STUB_INIT)
    for rel, path in files:
        dest = package / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, dest)
    argv = [*host_python_argv(image_rootfs), "-m", "compileall", "-q", "--invalidation-mode",
            "unchecked-hash", str(package)]
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


def _interpreter(image_rootfs: Path) -> tuple[Path, list[Path], Path]:
    """(loader, library dirs, python) of the image, as paths on the host."""
    libdirs = sorted(p for p in (image_rootfs / "usr" / "lib").glob("*-linux-gnu*")
                     if p.is_dir() and not p.is_symlink())
    loaders = [p for d in libdirs for p in d.glob("ld-linux*.so.*") if not p.is_symlink()]
    pythons = [p for p in (image_rootfs / "usr" / "bin").glob("python3.[0-9]*")
               if p.name.removeprefix("python3.").isdigit() and not p.is_symlink()]
    # By minor version as a number: python3.11 is newer than python3.9.
    pythons.sort(key=lambda p: int(p.name.removeprefix("python3.")))
    if not loaders or not pythons:
        raise DriverError(f"base image at {image_rootfs} has no python3 or no dynamic loader")
    return loaders[0], libdirs, pythons[-1]


def stage_loader(image_rootfs: Path) -> Path:
    """An execute-only copy of the image's loader, owned by host root (made once).

    Why: the kernel makes a process non-dumpable, and hands its memory to the
    host's user namespace, when it executes a file it cannot read (``would_dump``
    in fs/exec.c). Sandbox root can read every file whose owner is mapped into
    the sandbox, but not one owned by host root with mode 0111. Started through
    this copy, the agent cannot be ptraced, its fds cannot be taken with
    ``pidfd_getfd``, and its ``/proc/1`` files (mem, fd, environ, oom_score_adj)
    belong to host root: only ``CAP_SYS_PTRACE`` in the host's namespace reaches
    it. Commands it starts exec their own binaries and are debuggable as usual."""
    loader, _, _ = _interpreter(image_rootfs)
    target = image_rootfs.parent / LOADER_COPY
    try:
        st = target.stat()
        if st.st_uid == 0 and st.st_mode & 0o7777 == 0o111 and st.st_size == loader.stat().st_size:
            return target
    except FileNotFoundError:
        pass
    tmp = target.with_name(f".{LOADER_COPY}.{os.getpid()}")
    shutil.copyfile(loader, tmp)
    os.chown(tmp, 0, 0)
    os.chmod(tmp, 0o111)  # noqa: S103 - execute-only, readable by none
    os.rename(tmp, target)
    return target


def host_python_argv(image_rootfs: Path) -> list[str]:
    """Run the image's interpreter on the host (to byte-compile for it)."""
    loader, libdirs, python = _interpreter(image_rootfs)
    return [str(loader), "--inhibit-cache", "--library-path", ":".join(map(str, libdirs)),
            str(python), "-I", "-S"]


def agent_argv(image_rootfs: Path, *, fd: int, env_file: bool,
               private_loader: bool = True) -> list[str]:
    """The sandbox's first process: the image's python through the image's loader
    (its execute-only copy at :data:`LOADER` unless ``private_loader`` is false).

    Paths are resolved inside the image on the host, because the image's own
    ``/lib64/ld-linux-x86-64.so.2`` is an *absolute* symlink that would resolve
    into the user's overlay inside the sandbox."""
    loader, libdirs, python = _interpreter(image_rootfs)

    def inside(path: Path) -> str:
        return IMAGE_DIR + "/" + str(path.relative_to(image_rootfs))

    argv = [LOADER if private_loader else inside(loader), "--inhibit-cache",
            "--library-path", ":".join(inside(d) for d in libdirs),
            inside(python), "-I", "-S", "-c", staging.launch_code(AGENT_DIR), "--fd", str(fd)]
    if env_file:
        argv += ["--env-file", ENV_FILE]
    return argv
