"""Can this host run ``vm`` sandboxes, and at useful speed?

A device node is not proof: on some hosts ``/dev/kvm`` exists and a KVM guest
hangs. So the probe boots a guest, a busybox initramfs that prints a marker
and powers off, under TCG (does it work at all?) and, where ``/dev/kvm``
exists, under KVM (is it accelerated?), each bounded in time and killed when
the bound passes. The two boot side by side: where KVM hangs, its bound was
paid after the TCG boot, on every start of a server with the ``vm`` class.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from ...settings import Settings
from ..base import DriverError
from . import qemu
from .initramfs import find_busybox, newc
from .qemu import KERNEL_DIR, QEMU, QEMU_BARE, host_tsc_khz

MARKER = "podbay-vm-probe-ok"
TCG_BOUND_SECONDS = 60.0
KVM_BOUND_SECONDS = 15.0
_INIT = f"""#!/bin/busybox sh
/bin/busybox mount -t proc proc /proc
/bin/busybox echo {MARKER} $(/bin/busybox cut -d' ' -f1 /proc/uptime)
/bin/busybox poweroff -f
"""


@dataclass(frozen=True)
class VmProbe:
    works: bool
    #: A KVM guest booted within its bound.
    accelerated: bool
    detail: str


async def boot_marker(kernel: Path, initrd: Path, accel: str, within: float) -> float:
    """Boot the probe guest; seconds until it printed the marker. Raises
    ``TimeoutError`` (QEMU killed) or :class:`DriverError`."""
    append = "console=ttyS0 quiet panic=-1 tsc=reliable"
    khz = host_tsc_khz()
    if accel == "tcg" and khz:
        append += f" tsc_early_khz={khz}"
    started = time.perf_counter()
    proc = await asyncio.create_subprocess_exec(
        QEMU,
        "-M",
        "microvm",
        "-accel",
        accel,
        "-m",
        "128M",
        *QEMU_BARE,
        "-chardev",
        "stdio,id=console",
        "-serial",
        "chardev:console",
        "-kernel",
        str(kernel),
        "-initrd",
        str(initrd),
        "-append",
        append,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        async with asyncio.timeout(within):
            out, _ = await proc.communicate()
    finally:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
    text = out.decode(errors="replace")
    if MARKER not in text:
        raise DriverError(f"the guest did not come up: {text.strip()[-300:] or 'no output'}")
    return time.perf_counter() - started


def has_kvm_device() -> bool:
    return os.path.exists("/dev/kvm")


async def probe(settings: Settings) -> VmProbe:
    del settings  # the probe needs nothing configured
    if os.geteuid() != 0:
        return VmProbe(False, False, "needs root")
    if shutil.which(QEMU) is None:
        return VmProbe(False, False, f"{QEMU} not found (apt-get install qemu-system-x86)")
    try:
        release = qemu.kernel_release()
        busybox = find_busybox()
    except DriverError as e:
        return VmProbe(False, False, str(e))
    kernel = KERNEL_DIR / f"vmlinuz-{release}"
    with tempfile.TemporaryDirectory(prefix="podbay-vm-probe-") as tmp:
        initrd = Path(tmp) / "initrd"
        initrd.write_bytes(
            newc(
                [
                    ("bin", 0o040755, b""),
                    ("proc", 0o040755, b""),
                    ("dev", 0o040755, b""),
                    ("bin/busybox", 0o100755, busybox.read_bytes()),
                    ("init", 0o100755, _INIT.encode()),
                ]
            )
        )
        kvm_boot = (
            asyncio.ensure_future(boot_marker(kernel, initrd, "kvm", KVM_BOUND_SECONDS))
            if await asyncio.to_thread(has_kvm_device)
            else None
        )
        try:
            return await _verdict(release, initrd, kernel, kvm_boot)
        finally:
            if kvm_boot is not None:
                kvm_boot.cancel()  # still booting (TCG failed): its QEMU is killed
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await kvm_boot  # (its outcome is _verdict's, if it had one)


async def _verdict(
    release: str, initrd: Path, kernel: Path, kvm_boot: asyncio.Future[float] | None
) -> VmProbe:
    try:
        tcg = await boot_marker(kernel, initrd, "tcg", TCG_BOUND_SECONDS)
    except (TimeoutError, DriverError) as e:
        reason = "timed out" if isinstance(e, TimeoutError) else str(e)
        return VmProbe(False, False, f"a TCG guest did not boot: {reason}")
    summary = f"kernel {release}; a TCG guest booted in {tcg:.1f} s"
    if kvm_boot is None:
        return VmProbe(True, False, f"{summary}; no /dev/kvm (TCG only: slow)")
    try:
        kvm = await kvm_boot
    except TimeoutError:
        return VmProbe(
            True,
            False,
            f"{summary}; /dev/kvm exists but a KVM guest hung "
            f"(killed after {KVM_BOUND_SECONDS:.0f} s): TCG only",
        )
    except DriverError as e:
        return VmProbe(True, False, f"{summary}; KVM failed ({e}): TCG only")
    return VmProbe(True, True, f"{summary}; a KVM guest booted in {kvm:.1f} s")
