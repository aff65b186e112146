"""The ``container`` class's checkpoint: runc's ``checkpoint``/``restore`` with
podbay's own CRIU (:mod:`podbay.host.criu`).

:func:`checkpoint` writes the container's processes and memory to an image
directory and ends the container (its cgroup, pids and memory are released);
:func:`restore` starts it again from that directory with its processes where
they were. The driver's suspend and resume call them (runsc's counterpart is
:mod:`.checkpoint`). What runc needs, and why:

- ``--criu``: Debian 12's criu fails ``criu check`` on today's kernels; ours
  does not. ``CRIU_CONFIG_FILE`` in runc's environment makes CRIU lock the
  network with nftables (its default needs ``iptables-restore``).
- ``--image-path``: :data:`IMAGES` inside the caller's ``image_dir``, which is
  made root's alone (0700): that gate keeps every process but root's from the
  images. The images themselves keep CRIU's modes (0644, a 0755 directory):
  CRIU's restore opens them, through its open directory, as the sandbox's
  mapped root, and root's alone they fail (``Unable to open utsns-12.img:
  Permission denied``; ``timens-0.img`` when handed to the mapped uid).
  ``--work-path`` apart from it, so CRIU's logs are not part of the image.
- ``--bundle`` on restore: the same ``config.json`` the container ran with (its
  namespaces, mounts, cgroup, seccomp and rootfs are made again from it).
- The container's stdio must be pipes or ``/dev/null``: runc hands pipes over
  on restore, while a host file as stdout fails the dump (``Can't lookup mount``).

A failure is a :class:`DriverError` quoting CRIU's error lines from its log.
"""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import Sequence
from pathlib import Path

from podbay.host.criu import criu_env, criu_path

from ..base import DriverError
from .runc import Runc, wait_pid

#: Dump flags: established TCP connections and file locks are a sandbox's own
#: state (a dev server's clients, a database's locks) and are dumped with it.
DUMP_FLAGS = ("--tcp-established", "--file-locks")
#: The directory of CRIU's images inside a checkpoint's ``image_dir``.
IMAGES = "criu"
#: CRIU's error lines quoted in a DriverError.
QUOTED_LINES = 8


def _gate(image_dir: Path) -> None:
    """``image_dir`` made, root's, 0700 (see the module's docstring)."""
    image_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chown(image_dir, 0, 0)
    os.chmod(image_dir, 0o700)


def work_dir_for(image_dir: Path) -> Path:
    """Where CRIU's logs of ``image_dir``'s dump and restore go (beside it)."""
    return image_dir.with_name(f"{image_dir.name}.criu-work")


def _criu(criu: Path | None) -> Path:
    found = criu or criu_path()
    if found is None:
        raise DriverError(
            "no criu for the container class's checkpoint: ./run builds it "
            "(python -m podbay.host.criu_build)"
        )
    return found


def _argv(runc: Runc, criu: Path, *args: str) -> list[str]:
    return [runc.binary, "--root", str(runc.root), "--criu", str(criu), *args]


def _env() -> dict[str, str]:
    path = os.environ.get("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
    return {"PATH": path, **criu_env()}


def criu_errors(log: Path) -> str:
    """CRIU's error lines in ``log`` (the last few), for a DriverError."""
    try:
        lines = log.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    # RLIMIT_NOFILE's line is CRIU raising its own limit, and harmless.
    errors = [line for line in lines if "Error" in line and "RLIMIT_NOFILE" not in line]
    return " | ".join(errors[-QUOTED_LINES:])


async def checkpoint(
    runc: Runc,
    container_id: str,
    image_dir: Path,
    *,
    work_dir: Path | None = None,
    criu: Path | None = None,
    flags: Sequence[str] = DUMP_FLAGS,
) -> None:
    """Dump ``container_id`` into ``image_dir`` (see :data:`IMAGES`) and end it.

    On failure the container is left running as it was (runc's own rule)."""
    work = work_dir or work_dir_for(image_dir)
    _gate(image_dir)
    work.mkdir(mode=0o700, parents=True, exist_ok=True)
    (image_dir / IMAGES).mkdir(mode=0o755, exist_ok=True)
    argv = _argv(
        runc,
        _criu(criu),
        "checkpoint",
        *flags,
        "--image-path",
        str(image_dir / IMAGES),
        "--work-path",
        str(work),
        container_id,
    )
    proc = await asyncio.create_subprocess_exec(
        *argv,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        env=_env(),
    )
    out, _ = await proc.communicate()
    if proc.returncode != 0:
        said = out.decode(errors="replace").strip().splitlines()[-2:]
        raise DriverError(
            f"checkpoint of {container_id} failed: {' | '.join(said)}"
            f" | {criu_errors(work / 'dump.log')}"
        )


async def restore(
    runc: Runc,
    container_id: str,
    bundle: Path,
    image_dir: Path,
    *,
    work_dir: Path | None = None,
    criu: Path | None = None,
    stdio: tuple[int, int, int] | None = None,
    flags: Sequence[str] = DUMP_FLAGS,
) -> None:
    """Start ``container_id`` again, detached, from ``image_dir`` and ``bundle``.

    ``stdio`` (fds for 0, 1, 2) replaces the pipes the container's processes
    had: runc hands its own stdio over to them. Without it runc gets
    ``/dev/null`` and, for its own complaints, a file of the work directory
    (a container whose stdio was pipes would then write there: pass ``stdio``).
    runc's state for ``container_id`` must be gone (the checkpoint ended it, or
    ``runc delete`` did)."""
    work = work_dir or work_dir_for(image_dir)
    work.mkdir(mode=0o700, parents=True, exist_ok=True)
    argv = _argv(
        runc,
        _criu(criu),
        "restore",
        "--detach",
        *flags,
        "--image-path",
        str(image_dir / IMAGES),
        "--work-path",
        str(work),
        "--bundle",
        str(bundle),
        container_id,
    )
    null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    # runc's own complaints go to a file of the work directory, never to the
    # container's stdio when the caller gave none (it would be inherited).
    errors_path = work / "runc-restore.err"
    errors_fd = os.open(errors_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    _gate(image_dir)
    try:
        given = stdio or (null, null, errors_fd)
        pid = os.posix_spawn(  # noqa: ASYNC221 - returns at once; waited on by pidfd
            shutil.which(argv[0]) or argv[0],
            argv,
            _env(),
            file_actions=[(os.POSIX_SPAWN_DUP2, fd, n) for n, fd in enumerate(given)],
        )
        code = await wait_pid(pid)
    finally:
        os.close(null)
        os.close(errors_fd)
    if code != 0:
        said = errors_path.read_text(errors="replace").strip().splitlines()[-2:]
        raise DriverError(
            f"restore of {container_id} failed (exit {code}): {' | '.join(said)}"
            f" | {criu_errors(work / 'restore.log')}"
        )
