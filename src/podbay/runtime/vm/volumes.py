"""A ``vm`` guest's volumes: one ``virtiofsd`` per volume, QEMU's
``vhost-user-fs-device`` to it, a ``virtiofs`` mount in the guest.

Why virtiofs: the guest kernel here has ``virtiofs.ko`` and ``fuse.ko`` but
no 9p modules, and QEMU 7.2 ships the C ``virtiofsd``. The guest's memory is
then a shared memfd (vhost-user reads it), so such a machine boots cold,
never from a template (templates are saved without it).

Ownership: the guest's root is uid 0 of its own kernel, where a container
sandbox's root is host ``uid_base``. So each ``virtiofsd`` runs as root of a
user namespace mapping 0..65535 to ``uid_base``.. (the holder of
:mod:`podbay.host.userns`, then ``nsenter``): what the guest writes belongs
to sandbox root in every class, and the daemon holds no power on the host
beyond those uids. It gets its own mount namespace with a tmpfs on
``/run/virtiofsd`` (its lock directory) and exits when QEMU goes.

Read-only: the guest's kernel is the sandbox's own (its root could remount
a mount rw), so a read-only volume is served from a read-only bind mount
the host makes under the machine's run directory: its flag is locked for a
user namespace, and the daemon's writes fail with EROFS.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil
import socket
from pathlib import Path

from podbay.host import storage, userns
from podbay.host.machine import VolumeBind

from ..base import DriverError

VIRTIOFSD = ("/usr/lib/qemu/virtiofsd", "/usr/libexec/virtiofsd")
ID_RANGE = 65536
#: The guest's mount tag of volume ``i``.
TAG = "podbay-vol{}"
#: Where virtiofsd keeps its lock files: a tmpfs of each daemon's own.
LOCK_DIR = Path("/run/virtiofsd")
MS_BIND = 4096
MS_REMOUNT = 32
#: How long a daemon may take to make its socket.
SOCKET_SECONDS = 10.0


def find_virtiofsd() -> str | None:
    for candidate in VIRTIOFSD:
        if os.access(candidate, os.X_OK):
            return candidate
    return shutil.which("virtiofsd")


def volume_dir(run: Path) -> Path:
    return run / "volumes"


def socket_path(run: Path, index: int) -> Path:
    return volume_dir(run) / f"{index}.sock"


def guest_spec(volumes: tuple[VolumeBind, ...]) -> str:
    """What the guest's init mounts: ``tag,path,ro|rw`` words (paths have no
    commas or whitespace: attach refuses them)."""
    return " ".join(
        f"{TAG.format(i)},{v.destination},{'ro' if v.read_only else 'rw'}"
        for i, v in enumerate(volumes)
    )


def readonly_view(bind: VolumeBind, machine_id: str) -> Path:
    """Where a machine's read-only view of a volume is mounted: beside its
    ``data/``, on the volume's own root (the host's, never a sandbox's: each
    sees ``data/`` only), which the daemon's uid can reach, unlike the
    machine's run directory."""
    return bind.source.parent / f".ro-{machine_id}"


def _readonly_view(source: Path, target: Path) -> None:
    target.mkdir(mode=0o700, exist_ok=True)
    if storage.holds_own_mount(target) or storage.is_mounted(target):
        return
    storage.sys_mount(str(source), target, "", MS_BIND)
    storage.sys_mount("", target, "", MS_BIND | MS_REMOUNT | storage.MS_RDONLY | storage.MS_NOSUID)


async def serve(volumes: tuple[VolumeBind, ...], run: Path, uid_base: int) -> list[Path]:
    """Start a daemon per volume; their sockets, each ready for QEMU."""
    if not volumes:
        return []
    daemon = find_virtiofsd()
    if daemon is None:
        raise DriverError("vm volumes need virtiofsd (the qemu-system-common package)")
    where = volume_dir(run)
    where.mkdir(mode=0o700, exist_ok=True)
    sockets = []
    for index, bind in enumerate(volumes):
        source = bind.source
        if bind.read_only:
            view = readonly_view(bind, run.name)
            await asyncio.to_thread(_readonly_view, source, view)
            source = view
        sock = socket_path(run, index)
        sock.unlink(missing_ok=True)
        await _start(daemon, sock, source, uid_base)
        sockets.append(sock)
    return sockets


async def _start(daemon: str, sock: Path, source: Path, uid_base: int) -> None:
    owner = userns.OWNER_UID_BASE + secrets.randbelow(userns.OWNER_UID_COUNT)
    holder = userns.OwnedUserNamespace(owner, uid_base, ID_RANGE)
    # The host binds the socket (in the machine's run directory, which the
    # daemon's uid cannot enter) and hands the daemon the listening fd.
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(sock))
    listener.listen(1)
    await holder.open()
    log = sock.with_suffix(".log")
    try:
        # Its lock directory, private to it (/var/run is /run: not mounted over).
        LOCK_DIR.mkdir(mode=0o755, exist_ok=True)  # noqa: ASYNC240 - one mkdir
        tmpfs = f"mount -t tmpfs -o mode=755,size=1m podbay-virtiofsd {LOCK_DIR}"
        script = f'{tmpfs} && exec "$0" "$@"'
        # setsid -f: the daemon is no child of the node (init reaps it when
        # QEMU's going ends it), and this returns once it is forked.
        with open(log, "wb") as errors:  # noqa: ASYNC230 - opened, not read or written here
            proc = await asyncio.create_subprocess_exec(
                "setsid",
                "-f",
                "nsenter",
                f"--user={holder.userns_path}",
                "--setuid",
                "0",
                "--setgid",
                "0",
                "--",
                "unshare",
                "--mount",
                "--propagation",
                "private",
                "--",
                "sh",
                "-c",
                script,
                daemon,
                f"--fd={listener.fileno()}",
                "-o",
                f"source={source}",
                "-o",
                "cache=none",
                stdin=asyncio.subprocess.DEVNULL,
                stdout=errors,
                stderr=errors,
                pass_fds=(listener.fileno(),),
            )
            await proc.wait()
        # Ready once it waits on the socket (it says so), or failed (it exits).
        loop = asyncio.get_running_loop()
        deadline = loop.time() + SOCKET_SECONDS
        while b"Waiting for vhost-user socket" not in log.read_bytes():
            if loop.time() > deadline:
                said = log.read_text(errors="replace")[-2000:]
                raise DriverError(f"virtiofsd did not start: {said}")
            await asyncio.sleep(0.01)
    finally:
        listener.close()  # the daemon holds its own copy
        await holder.close()


def release(run: Path, volumes: tuple[VolumeBind, ...]) -> None:
    """Unmount a machine's read-only views (its daemons end with QEMU)."""
    for bind in volumes:
        if bind.read_only:
            view = readonly_view(bind, run.name)
            storage.sys_umount(view, lazy=True)
            with contextlib.suppress(OSError):
                view.rmdir()
    shutil.rmtree(volume_dir(run), ignore_errors=True)
