"""QEMU's command line for a ``vm`` machine, and the files it is given.

What the driver (:mod:`.driver`) starts and where each of a machine's files
lives: the guest kernel, the host's TSC frequency the guest is told under
TCG, the guest's side of QEMU's user-mode network, and the argv itself.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from podbay.errors import DriverError
from podbay.host.layout import MachineDirs

QEMU = "qemu-system-x86_64"
#: Nothing QEMU would add on its own: no default devices, no user config file,
#: no display, and an exit (not a reboot) when the guest ends.
QEMU_BARE = ("-nodefaults", "-no-user-config", "-display", "none", "-no-reboot")
KERNEL_DIR = Path("/boot")
#: A file in a machine's directory once its disk has been used (no template restore then).
BOOTED = "booted"
#: The agent's options in every guest (a template's too).
AGENT_OPTIONS = ["--env-file", "/.podbay/run/env.json"]
#: The guest's side of QEMU's user-mode network. Its resolv.conf names the
#: namespace's DNS forwarder (10.0.2.3), reached through QEMU like any address.
GUEST_NET = "10.0.5.0/24"
GUEST_ADDRESS = "10.0.5.15/24"
GUEST_GATEWAY = "10.0.5.2"
GUEST_DNS_ALIAS = "10.0.5.3"
GUEST_NETWORK = f"""\
for m in $($B cat /net-modules); do $B insmod /lib/modules/$m.ko; done
$B ip link set eth0 up
$B ip addr add {GUEST_ADDRESS} dev eth0
$B ip route add default via {GUEST_GATEWAY}"""


def kernel_release() -> str:
    """The newest Debian cloud kernel installed for guests."""
    found = sorted(KERNEL_DIR.glob("vmlinuz-*-cloud-amd64"))
    if not found:
        raise DriverError("no guest kernel: apt-get install linux-image-cloud-amd64")
    return found[-1].name.removeprefix("vmlinuz-")


def host_tsc_khz() -> int | None:
    """The host TSC frequency. Under TCG the guest reads the host's TSC, and its
    kernel's calibration against the emulated PIT fails on a busy host (seen:
    the boot then hangs), so the guest is told the frequency instead."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    if "constant_tsc" not in text:
        return None
    for line in text.splitlines():
        if line.startswith("cpu MHz"):
            return int(float(line.split(":")[1]) * 1000)
    return None


@dataclasses.dataclass(frozen=True)
class VmPaths(MachineDirs):
    @property
    def mux(self) -> Path:
        return self.run / "mux.sock"

    @property
    def qmp(self) -> Path:
        return self.run / "qmp.sock"

    @property
    def pidfile(self) -> Path:
        return self.run / "qemu.pid"

    @property
    def initrd(self) -> Path:
        return self.run / "initrd"

    @property
    def booted(self) -> Path:
        """Present once the machine's disk has been used (no template restore then)."""
        return self.home / BOOTED


def qemu_argv(
    *,
    machine_id: str,
    memory_mib: int,
    cpus: int,
    accel: str,
    kernel: Path,
    initrd: Path,
    disks: list[Path],
    paths: VmPaths,
    network: bool,
    volume_sockets: list[Path] | None = None,
) -> list[str]:
    """QEMU's command line for one machine: ``disks`` are the base image and
    the layers, read-only, before the machine's own disk (``paths``);
    ``volume_sockets``: a ``virtiofsd`` of each volume (:mod:`.volumes`),
    whose guest memory must then be shared."""
    append = [
        "console=ttyS0",
        "quiet",
        "panic=-1",
        "reboot=t",
        "tsc=reliable",
        "8250.nr_uarts=1",
        "cryptomgr.notests",
        "random.trust_cpu=on",
    ]
    if accel == "tcg":
        khz = host_tsc_khz()
        if khz:
            append.append(f"tsc_early_khz={khz}")
    accel = "kvm" if accel == "kvm" else "tcg,tb-size=64"
    # Under TCG the "max" model (every feature QEMU emulates) made exec in the
    # guest ~40 % faster than the default qemu64 (fewer full TLB flushes).
    cpu = "host" if accel == "kvm" else "max"
    argv = [
        QEMU,
        "-name",
        f"podbay-{machine_id}",
        "-M",
        "microvm,x-option-roms=off" + (",memory-backend=mem" if volume_sockets else ""),
        "-accel",
        accel,
        "-cpu",
        cpu,
        "-m",
        f"{memory_mib}M",
        "-smp",
        str(cpus),
        *QEMU_BARE,
        "-chardev",
        "ringbuf,id=console,size=65536",
        "-serial",
        "chardev:console",
        "-kernel",
        str(kernel),
        "-initrd",
        str(initrd),
        "-append",
        " ".join(append),
    ]
    base, *layers = disks
    drives = [("base", base, True)]
    drives += [(f"layer{i}", path, True) for i, path in enumerate(layers)]
    drives.append(("disk", paths.disk_image, False))
    for serial, path, readonly in drives:
        options = f"id={serial},file={path},format=raw,if=none"
        if readonly:
            options += ",readonly=on,cache=unsafe"
        else:
            options += ",discard=unmap"
        argv += [
            "-drive",
            options,
            "-device",
            f"virtio-blk-device,drive={serial},serial={serial}",
        ]
    if volume_sockets:
        # vhost-user needs modern virtio (microvm's mmio devices default to legacy).
        argv += [
            "-object",
            f"memory-backend-memfd,id=mem,size={memory_mib}M,share=on",
            "-global",
            "virtio-mmio.force-legacy=false",
        ]
    for index, sock in enumerate(volume_sockets or ()):
        argv += [
            "-chardev",
            f"socket,id=vol{index},path={sock}",
            "-device",
            f"vhost-user-fs-device,chardev=vol{index},tag=podbay-vol{index}",
        ]
    if network:
        argv += [
            "-netdev",
            f"user,id=net,ipv6=off,net={GUEST_NET},host={GUEST_GATEWAY},dns={GUEST_DNS_ALIAS}",
            "-device",
            "virtio-net-device,netdev=net",
        ]
    argv += [
        "-device",
        "virtio-serial-device",
        "-chardev",
        f"socket,id=agent,path={paths.mux},server=on,wait=off",
        "-device",
        "virtserialport,chardev=agent,name=podbay",
        "-qmp",
        f"unix:{paths.qmp},server=on,wait=off",
        "-pidfile",
        str(paths.pidfile),
        "-daemonize",
    ]
    return argv
