"""The guest's initramfs: busybox, the virtio modules, a shell init and the agent.

Built once per (kernel, agent, this code) and cached; each boot appends a
small second archive with that machine's configuration (the kernel unpacks
concatenated ``newc`` archives in order), so nothing per machine is rebuilt.

The init mounts the base image and layers read-only (found by the disks'
serial numbers, not by probe order), the machine's disk, the overlay of them
all, copies the agent into a tmpfs, binds the pristine image under
``/.podbay/image`` and ``switch_root``-s into the overlay, running
:mod:`guest.init` as PID 1, which execs the agent.

>>> newc([("a", 0o100644, b"x")])[:6]
b'070701'
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shlex
import shutil
import time
from collections.abc import Iterable
from pathlib import Path

from ..base import DriverError

#: Loaded in this order; virtio_net is loaded only when the machine has a network.
MODULES = (
    "drivers/virtio/virtio_ring",
    "drivers/virtio/virtio",
    "drivers/virtio/virtio_mmio",
    "drivers/block/virtio_blk",
    "drivers/char/virtio_console",
    "fs/overlayfs/overlay",
    "net/core/failover",
    "drivers/net/net_failover",
    "drivers/net/virtio_net",
)
#: Loaded only when the machine mounts volumes (virtiofs, see .volumes).
FS_MODULES = ("fs/fuse/fuse", "fs/fuse/virtiofs")
BUSYBOX = ("/usr/bin/busybox", "/bin/busybox")
GUEST_DIR = Path(__file__).with_name("guest")
STALE_SECONDS = 3600
GUEST_FILES = ("__init__.py", "frames.py", "init.py")

INIT = r"""#!/bin/busybox sh
B=/bin/busybox
$B mount -t devtmpfs dev /dev
$B mount -t proc proc /proc
$B mount -t sysfs sys /sys
for m in $($B cat /modules); do
    $B insmod /lib/modules/$m.ko || $B echo "podbay-vm: insmod $m failed"
done
. /config/vars.sh
fail() { $B echo "podbay-vm: $*"; $B poweroff -f; }
for d in /sys/block/vd*; do
    s=$($B cat $d/serial 2>/dev/null); [ -n "$s" ] && $B ln -s /dev/${d##*/} /dev/pb-$s
done
$B mkdir -p /base /disk /newroot
$B mount -t ext4 -o ro /dev/pb-base /base || fail "base image not mounted"
lower=/base
i=0
while [ $i -lt $LAYERS ]; do
    $B mkdir -p /l$i && $B mount -t ext4 -o ro /dev/pb-layer$i /l$i || fail "layer $i"
    lower=/l$i:$lower
    i=$((i+1))
done
$B mount -t ext4 -o nosuid,nodev /dev/pb-disk /disk || fail "disk not mounted"
$B mkdir -p /disk/upper /disk/work
$B mount -t overlay overlay -o lowerdir=$lower,upperdir=/disk/upper,workdir=/disk/work /newroot \
    || fail "overlay"
N=/newroot
$B mkdir -p $N/.podbay/agent $N/.podbay/image $N/.podbay/run $N/dev $N/proc $N/sys
$B mount -t tmpfs -o mode=755,size=32m podbay-agent $N/.podbay/agent
$B cp -a /agent/. $N/.podbay/agent/
$B mount -o remount,ro $N/.podbay/agent
$B mount -t tmpfs -o mode=755,size=1m podbay-run $N/.podbay/run
$B cp /config/run/* $N/.podbay/run/
$B mount --bind /base $N/.podbay/image
for f in hostname hosts resolv.conf; do
    [ -e $N/.podbay/run/$f ] || continue
    [ -L $N/etc/$f ] && $B rm -f $N/etc/$f
    [ -e $N/etc/$f ] || $B touch $N/etc/$f
    $B mount --bind $N/.podbay/run/$f $N/etc/$f
done
if [ -n "$VOLUMES" ]; then
    for m in $($B cat /fs-modules); do $B insmod /lib/modules/$m.ko || fail "insmod $m"; done
    for v in $VOLUMES; do
        tag=${v%%,*}; rest=${v#*,}; at=${rest%,*}; mode=${rest##*,}
        $B mkdir -p "$N$at" && $B mount -t virtiofs -o "$mode,nosuid,nodev" "$tag" "$N$at" \
            || fail "volume $tag at $at"
    done
fi
$B echo "podbay-vm: switching root at $($B cut -d" " -f1 /proc/uptime)"
$B mount --move /dev $N/dev
$B mount --move /proc $N/proc
$B mount --move /sys $N/sys
$B mkdir -p $N/dev/pts $N/dev/shm $N/sys/fs/cgroup
$B mount -t devpts -o newinstance,ptmxmode=0666 devpts $N/dev/pts
$B mount -t tmpfs -o nosuid,nodev shm $N/dev/shm
$B mount -t cgroup2 cgroup2 $N/sys/fs/cgroup
$B ip link set lo up
[ -n "$NETWORK" ] && network
# PID 1's environment is exactly the agent's start-up settings (INIT_ENV).
eval "exec $B env -i $INIT_ENV $B switch_root $N $PODBAY_INIT"
"""


def _kernel_modules(release: str) -> Path:
    return Path("/lib/modules") / release / "kernel"


def find_busybox() -> Path:
    for candidate in BUSYBOX:
        path = Path(candidate)
        if path.is_file():
            with open(path, "rb") as binary:
                head = binary.read(4096)
            if b"\x00/lib64/ld-linux" not in head and b"ld-linux" not in head:
                return path
    raise DriverError("the vm driver needs a static busybox (apt-get install busybox-static)")


def newc(entries: Iterable[tuple[str, int, bytes]]) -> bytes:
    """A ``newc`` cpio archive of (name, mode, data) entries, with its trailer."""
    out = bytearray()
    ino = 1

    def add(name: str, mode: int, data: bytes) -> None:
        nonlocal ino
        encoded = name.encode() + b"\0"
        fields = (
            ino,
            mode,
            0,
            0,
            2 if mode & 0o040000 else 1,
            0,
            len(data),
            0,
            0,
            0,
            0,
            len(encoded),
            0,
        )
        out.extend(b"070701" + b"".join(b"%08X" % v for v in fields) + encoded)
        out.extend(b"\0" * (-len(out) % 4))
        out.extend(data)
        out.extend(b"\0" * (-len(out) % 4))
        ino += 1

    for name, mode, data in entries:
        add(name, mode, data)
    add("TRAILER!!!", 0, b"")
    out.extend(b"\0" * (-len(out) % 512))
    return bytes(out)


def _tree(source: Path, prefix: str) -> list[tuple[str, int, bytes]]:
    """Directories and regular files under ``source`` (symlinks are not staged)."""
    entries: list[tuple[str, int, bytes]] = [(prefix, 0o040755, b"")]
    for dirpath, dirnames, filenames in os.walk(source):
        dirnames.sort()
        rel = Path(dirpath).relative_to(source)
        for name in dirnames:
            entries.append((f"{prefix}/{rel / name}".replace("/./", "/"), 0o040755, b""))
        for name in sorted(filenames):
            path = Path(dirpath) / name
            if path.is_symlink() or not path.is_file():
                continue
            entries.append(
                (f"{prefix}/{rel / name}".replace("/./", "/"), 0o100644, path.read_bytes())
            )
    return entries


def build(dest_dir: Path, *, kernel_release: str, agent_dir: Path) -> Path:
    """The cached base initramfs for this kernel and staged agent (built if missing)."""
    busybox = find_busybox()
    modules = _kernel_modules(kernel_release)
    digest = hashlib.sha256()
    for part in (
        INIT.encode(),
        kernel_release.encode(),
        str(agent_dir).encode(),
        busybox.read_bytes()[:4096],
        *((GUEST_DIR / n).read_bytes() for n in GUEST_FILES),
    ):
        digest.update(hashlib.sha256(part).digest())
    target = dest_dir / f"initramfs-{digest.hexdigest()[:16]}.cpio"
    if target.exists():
        return target
    entries: list[tuple[str, int, bytes]] = [
        (d, 0o040755, b"")
        for d in ("bin", "dev", "proc", "sys", "lib", "lib/modules", "config", "newroot")
    ]
    entries.append(("bin/busybox", 0o100755, busybox.read_bytes()))
    names = []
    for module in MODULES:
        path = modules / f"{module}.ko"
        if not path.is_file():
            raise DriverError(f"kernel module {path} is missing (linux-image-cloud-amd64?)")
        name = Path(module).name
        names.append(name)
        entries.append((f"lib/modules/{name}.ko", 0o100644, path.read_bytes()))
    fs_names = []
    for module in FS_MODULES:
        path = modules / f"{module}.ko"
        if path.is_file():  # absent: a volume's mount fails in the guest, saying so
            fs_names.append(Path(module).name)
            entries.append((f"lib/modules/{Path(module).name}.ko", 0o100644, path.read_bytes()))
    entries.append(("fs-modules", 0o100644, (" ".join(fs_names) + "\n").encode()))
    entries.append(("modules", 0o100644, (" ".join(names[:6]) + "\n").encode()))
    entries.append(("net-modules", 0o100644, (" ".join(names[6:]) + "\n").encode()))
    entries.append(("init", 0o100755, INIT.encode()))
    entries += _tree(agent_dir, "agent")
    entries.append(("agent/podbay_vm", 0o040755, b""))
    for name in GUEST_FILES:
        entries.append((f"agent/podbay_vm/{name}", 0o100644, (GUEST_DIR / name).read_bytes()))
    dest_dir.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}")
    tmp.write_bytes(newc(entries))
    os.rename(tmp, target)
    _remove_stale(dest_dir, keep=target)
    return target


def _remove_stale(directory: Path, *, keep: Path) -> None:
    """Initramfs files of earlier podbay versions, unused for an hour (each boot
    copies its own, so only a node still running an old version reads one)."""
    cutoff = time.time() - STALE_SECONDS
    for old in directory.glob("initramfs-*.cpio"):
        with contextlib.suppress(OSError):
            if old != keep and old.stat().st_mtime < cutoff:
                old.unlink()


def boot_archive(
    base: Path,
    dest: Path,
    *,
    variables: dict[str, str],
    init_argv: list[str],
    network_script: str,
    run_files: dict[str, str],
) -> None:
    """``base`` followed by this boot's configuration, written to ``dest``."""
    lines = [f"{key}={shlex.quote(value)}" for key, value in variables.items()]
    lines.append("PODBAY_INIT=" + shlex.quote(shlex.join(init_argv)))
    lines.append("network() {\n" + (network_script or ":") + "\n}")
    entries: list[tuple[str, int, bytes]] = [
        ("config/vars.sh", 0o100644, ("\n".join(lines) + "\n").encode()),
        ("config/run", 0o040755, b""),
    ]
    entries += [
        (f"config/run/{name}", 0o100644, text.encode()) for name, text in sorted(run_files.items())
    ]
    with contextlib.suppress(OSError):
        os.utime(base)  # in use: not stale (see _remove_stale)
    tmp = dest.with_name(f".{dest.name}.tmp")
    with open(tmp, "wb") as out, open(base, "rb") as source:
        shutil.copyfileobj(source, out)
        out.write(newc(entries))
    os.rename(tmp, dest)
