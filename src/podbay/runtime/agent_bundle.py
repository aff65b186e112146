"""Run the staged agent on the pristine base image's interpreter.

The agent's code is staged by :func:`podbay.runtime.staging.stage` under
``<data>/agent/<content hash>/``, byte-compiled by the image's interpreter
(:func:`image_python` gives its host paths), and bound read-only into each
sandbox at :data:`AGENT_DIR`.

The agent runs on the *pristine* base image's interpreter, through the
image's own dynamic loader with the library cache ignored, so nothing a user
does to ``/usr``, ``/lib`` or ``ld.so.cache`` in their overlay reaches it
(see :func:`sandbox_argv`).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from podbay.agent.protocol import DEFAULT_UID

from . import staging
from .base import DriverError

#: Where, inside a sandbox, the pristine image and the agent's code are bound.
IMAGE_DIR = "/.podbay/image"
AGENT_DIR = "/.podbay/agent"
ENV_FILE = "/.podbay/env.json"
#: The image's dynamic loader, as an execute-only file owned by host root (see
#: :func:`stage_loader`); the agent is started through it.
LOADER = "/.podbay/loader"
#: Its copy on the host, next to the image's rootfs.
LOADER_COPY = "agent-loader"
#: An empty read-only file, next to it, bound over the sandbox's
#: ``/etc/ld.so.preload``: the loader reads that file at the agent's every start
#: and wake, and one that sandbox root wrote would put its code in the agent.
NO_PRELOAD = "empty-ld.so.preload"


def _interpreter(image_rootfs: Path) -> tuple[Path, list[Path], Path]:
    """(loader, library dirs, python) of the image, as paths on the host."""
    libdirs = sorted(
        p
        for p in (image_rootfs / "usr" / "lib").glob("*-linux-gnu*")
        if p.is_dir() and not p.is_symlink()
    )
    loaders = [p for d in libdirs for p in d.glob("ld-linux*.so.*") if not p.is_symlink()]
    pythons = [
        p
        for p in (image_rootfs / "usr" / "bin").glob("python3.[0-9]*")
        if p.name.removeprefix("python3.").isdigit() and not p.is_symlink()
    ]
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
    _stage_no_preload(image_rootfs.parent / NO_PRELOAD)
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


def _stage_no_preload(target: Path) -> None:
    """:data:`NO_PRELOAD`: empty, owned by host root, read-only (made once)."""
    try:
        st = target.stat()
        if st.st_uid == 0 and st.st_size == 0 and st.st_mode & 0o7777 == 0o444:
            return
    except FileNotFoundError:
        pass
    tmp = target.with_name(f".{NO_PRELOAD}.{os.getpid()}")
    tmp.write_bytes(b"")
    os.chown(tmp, 0, 0)
    os.chmod(tmp, 0o444)
    os.rename(tmp, target)


def image_python(
    image_rootfs: Path, *, inside: bool = False, private_loader: bool = False
) -> list[str]:
    """The image's python through the image's loader: by host paths (to
    byte-compile for it), or as the sandbox sees them (``inside``, under
    :data:`IMAGE_DIR`; with ``private_loader``, through the execute-only
    copy at :data:`LOADER`).

    Resolved in the image on the host, because the image's own
    ``/lib64/ld-linux-x86-64.so.2`` is an *absolute* symlink that would resolve
    into the user's overlay inside the sandbox."""
    loader, libdirs, python = _interpreter(image_rootfs)

    def where(path: Path) -> str:
        return IMAGE_DIR + "/" + str(path.relative_to(image_rootfs)) if inside else str(path)

    return [
        LOADER if inside and private_loader else where(loader),
        "--inhibit-cache",
        "--library-path",
        ":".join(where(d) for d in libdirs),
        where(python),
    ]


def sandbox_argv(
    image_rootfs: Path,
    *,
    private_loader: bool = True,
    socket: str | None = None,
    launcher: str | None = None,
    waiter: str | None = None,
) -> list[str]:
    """The sandbox's first process: the agent on the image's python (see
    :func:`image_python`), serving the socket on fd 3 (or binding the path
    ``socket`` when one is given), with the sandbox's env file.

    Without the private loader (a kernel of the sandbox's own: gVisor) the
    agent guards itself instead: it runs as :data:`~podbay.agent.protocol.DEFAULT_UID` and
    starts commands in user namespaces without that id (:mod:`podbay.agent.guard`),
    through the program ``launcher`` when one is given (``launcher.c``), and
    hibernates into the program ``waiter`` when one is given (``waiter.c``)."""
    listen = ["--socket", socket] if socket else ["--fd", "3"]
    guarded = [] if private_loader else ["--guard-uid", str(DEFAULT_UID)]
    if guarded and launcher:
        guarded += ["--launcher", launcher]
    if guarded and waiter:
        guarded += ["--waiter", waiter]
    agent = staging.agent_argv(
        image_python(image_rootfs, inside=True, private_loader=private_loader),
        AGENT_DIR,
        *listen,
        "--env-file",
        ENV_FILE,
        *guarded,
    )
    shell = _image_shell(image_rootfs) if private_loader else None
    if shell is None:
        return agent
    # The agent lowers and raises its own OOM score around starting commands
    # (podbay.agent.oom); once non-dumpable it can no longer open that file, so
    # a shell of the image opens it first, while dumpable, and execs the agent.
    return [
        *shell,
        "-c",
        f'command exec {OOM_FD}<>/proc/self/oom_score_adj; unset PWD; exec "$0" "$@"',
        *agent,
        "--oom-fd",
        str(OOM_FD),
    ]


#: The descriptor the agent finds its own ``oom_score_adj`` on (runc).
OOM_FD = 4


def _image_shell(image_rootfs: Path) -> list[str] | None:
    """The image's dash through the image's loader, as the sandbox sees them."""
    dash = image_rootfs / "usr" / "bin" / "dash"
    if not dash.is_file() or dash.is_symlink():
        return None
    loader, libdirs, _ = _interpreter(image_rootfs)

    def inside(path: Path) -> str:
        return IMAGE_DIR + "/" + str(path.relative_to(image_rootfs))

    return [
        inside(loader),
        "--inhibit-cache",
        "--library-path",
        ":".join(inside(d) for d in libdirs),
        inside(dash),
    ]
