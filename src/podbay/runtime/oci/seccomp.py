"""The sandbox's seccomp profile: allow by default, refuse what a container never needs.

In the spirit of Docker's default profile, written as a deny list so that new,
harmless system calls keep working: kernel keyrings, BPF, perf, module and
kexec loading, every mount API, namespace creation and joining, reboot,
swap, accounting, quotas, raw port I/O, io_uring, userfaultfd, clock
setting. Refusals return ``EPERM`` (``clone3`` returns ``ENOSYS`` so that
libc falls back to ``clone``, whose flags *can* be checked).

>>> profile()["defaultAction"]
'SCMP_ACT_ALLOW'
"""

from __future__ import annotations

import errno
from typing import Any

DENIED: tuple[str, ...] = (
    # kernel keyrings
    "add_key",
    "keyctl",
    "request_key",
    # BPF, perf, tracing the kernel
    "bpf",
    "perf_event_open",
    "lookup_dcookie",
    "syslog",
    # modules and kexec
    "create_module",
    "delete_module",
    "finit_module",
    "init_module",
    "get_kernel_syms",
    "query_module",
    "kexec_file_load",
    "kexec_load",
    # mounts, old and new API
    "mount",
    "umount",
    "umount2",
    "pivot_root",
    "fsconfig",
    "fsmount",
    "fsopen",
    "fspick",
    "move_mount",
    "open_tree",
    "mount_setattr",
    # namespaces
    "unshare",
    "setns",
    # host-wide switches
    "reboot",
    "swapon",
    "swapoff",
    "acct",
    "quotactl",
    "quotactl_fd",
    "sysfs",
    "_sysctl",
    "ustat",
    "uselib",
    "vhangup",
    "nfsservctl",
    # raw I/O and old modes
    "iopl",
    "ioperm",
    "vm86",
    "vm86old",
    # time
    "clock_adjtime",
    "clock_settime",
    "settimeofday",
    "stime",
    # file handles (the "shocker" escape), userfaultfd, io_uring
    "open_by_handle_at",
    "userfaultfd",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
)

#: clone(2) flags that create namespaces (CLONE_NEWNS … CLONE_NEWNET, CLONE_NEWCGROUP, NEWTIME).
NAMESPACE_FLAGS = (
    0x00020000,
    0x02000000,
    0x04000000,
    0x08000000,
    0x10000000,
    0x20000000,
    0x40000000,
    0x00000080,
)

ARCHES = (
    "SCMP_ARCH_X86_64",
    "SCMP_ARCH_X86",
    "SCMP_ARCH_X32",
    "SCMP_ARCH_AARCH64",
    "SCMP_ARCH_ARM",
)


def profile() -> dict[str, Any]:
    """The OCI ``linux.seccomp`` section."""
    syscalls: list[dict[str, Any]] = [
        {"names": list(DENIED), "action": "SCMP_ACT_ERRNO", "errnoRet": errno.EPERM},
        {"names": ["clone3"], "action": "SCMP_ACT_ERRNO", "errnoRet": errno.ENOSYS},
    ]
    # clone(flags, ...): refuse when any namespace flag is set. On x86_64 the flags
    # are argument 0 (s390 swaps them, which this profile does not target).
    for flag in NAMESPACE_FLAGS:
        syscalls.append(
            {
                "names": ["clone"],
                "action": "SCMP_ACT_ERRNO",
                "errnoRet": errno.EPERM,
                "args": [{"index": 0, "value": flag, "valueTwo": flag, "op": "SCMP_CMP_MASKED_EQ"}],
            }
        )
    return {"defaultAction": "SCMP_ACT_ALLOW", "architectures": list(ARCHES), "syscalls": syscalls}
