"""A ``vm`` machine's QEMU on the host: the guest's RAM and vCPUs as its
limits give them, and what QEMU itself may use beside them (its cgroup's
memory, pids and CPUs, and its descriptor cap)."""

from __future__ import annotations

import dataclasses
import math

from podbay.host.machine import MachineSpec

#: Guest RAM below this cannot hold the kernel, page cache and the agent.
MIN_MEMORY_MIB = 192
#: QEMU's own host memory beside the guest's RAM: its code and heap, TCG's
#: translation cache (``tb-size=64``), libslirp's state per guest connection
#: (about 15 KiB each with MALLOC_MMAP_THRESHOLD below). See docs/runtime.md.
QEMU_OVERHEAD_MIB = 256
#: QEMU's threads beside one per vCPU: its main loop, RCU, and the block layer's
#: worker pool (at most 64); ``exec:`` migrations add a shell and ``cat``.
QEMU_PIDS = 96
#: Descriptors QEMU holds for itself (disks, chardevs, QMP, event fds: 16 seen);
#: beyond these each guest connection is one of libslirp's sockets, capped like
#: slirp4netns's (``runtime.slirp_max_fds``).
QEMU_OWN_FDS = 64
#: glibc adjusts its mmap threshold upwards once a large block is freed; from then
#: on libslirp's two 128 KiB buffers per connection came from the heap and stayed
#: resident: 1,000 idle guest connections took QEMU's RSS from 257 to 512 MiB.
#: A fixed threshold keeps them mapped on demand (272 MiB).
QEMU_MALLOC_ENV = "MALLOC_MMAP_THRESHOLD_=131072"


@dataclasses.dataclass(frozen=True)
class QemuBudget:
    """A machine's QEMU on the host: its cgroup's limits and RLIMIT_NOFILE."""

    memory_bytes: int
    pids: int
    cpus: float
    max_fds: int


def guest_cpus(spec: MachineSpec) -> int:
    """The guest's vCPUs: its CPU limit, rounded up, at least one."""
    return max(1, math.ceil(spec.limits.cpus))


def guest_mib(spec: MachineSpec) -> int:
    return max(MIN_MEMORY_MIB, spec.limits.memory_bytes >> 20)


def qemu_budget(spec: MachineSpec, slirp_fds: int) -> QemuBudget:
    """What QEMU may use on the host: the guest's RAM and CPUs, its own share,
    and ``slirp_fds`` descriptors for the guest's connections (0: no network)."""
    return QemuBudget(
        memory_bytes=(guest_mib(spec) + QEMU_OVERHEAD_MIB) << 20,
        pids=QEMU_PIDS + guest_cpus(spec),
        cpus=spec.limits.cpus,
        max_fds=QEMU_OWN_FDS + slirp_fds,
    )
