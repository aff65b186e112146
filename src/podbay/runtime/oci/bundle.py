"""The OCI ``config.json`` of one machine: namespaces, limits, mounts, hardening.

Pure: a function from facts to a dict, so tests can read it without runc.
What it sets and why:

- user namespace mapping sandbox uid/gid 0..65535 to ``uid_base``..: root
  inside owns the (shifted) image and nothing on the host;
- pid, mount, ipc, uts, network and cgroup namespaces (network joins a
  host-made namespace when one is given, else a fresh loopback-only one);
- Docker's default capability set but ``NET_RAW`` (no ``SYS_ADMIN``, no ``NET_ADMIN``),
  ``noNewPrivileges``, our seccomp profile, runc's masked and read-only paths;
- memory, CPU and pids limits on the machine's cgroup;
- the pristine image and the agent bound read-only under ``/.podbay``.

>>> cfg = config(BundleFacts(machine_id="m1", hostname="h", rootfs=Path("/r"),
...     image_rootfs=Path("/i"), agent_dir=Path("/a"), files_dir=Path("/f"),
...     argv=["/x"], uid_base=1000000, memory_bytes=1 << 30, cpus=1.0, pids=256,
...     cgroup_path="/podbay/m1"))
>>> cfg["linux"]["resources"]["pids"]
{'limit': 256}
"""

from __future__ import annotations

import resource
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from podbay.agent.protocol import HIBERNATE_ENV
from podbay.host.machine import VolumeBind
from podbay.runtime.staging import AGENT_ENV

from ..agent_bundle import AGENT_DIR, ENV_FILE, IMAGE_DIR, LOADER, NO_PRELOAD
from . import seccomp

ID_RANGE = 65536

#: Docker's default set but CAP_NET_RAW: the sandbox's user namespace owns its
#: network namespace (see :mod:`.userns`), where raw and packet sockets would
#: send frames to slirp4netns past the egress rules.
CAPABILITIES = [
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FSETID",
    "CAP_FOWNER",
    "CAP_MKNOD",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETFCAP",
    "CAP_SETPCAP",
    "CAP_NET_BIND_SERVICE",
    "CAP_SYS_CHROOT",
    "CAP_KILL",
    "CAP_AUDIT_WRITE",
]

MASKED_PATHS = [
    "/proc/acpi",
    "/proc/asound",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
    "/sys/devices/virtual/powercap",
]
READONLY_PATHS = ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"]

#: The container's own environment: the agent's (with its malloc tuning, which
#: keeps RSS down after bursts of large outputs). Commands get theirs from the agent.
PROCESS_ENV = [
    "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "HOME=/root",
    *(f"{k}={v}" for k, v in sorted(AGENT_ENV.items())),
]


@dataclass(frozen=True, kw_only=True)
class BundleFacts:
    machine_id: str
    hostname: str
    rootfs: Path
    image_rootfs: Path
    agent_dir: Path
    #: Host dir with ``env.json``, ``hosts``, ``hostname``, ``resolv.conf``.
    files_dir: Path
    argv: list[str]
    uid_base: int
    memory_bytes: int
    cpus: float
    pids: int
    cgroup_path: str
    #: A network namespace made by the host; ``None`` gives a fresh loopback-only one.
    netns: Path | None = None
    resolv_conf: bool = False
    #: Cap swap at zero too (the host's cgroup supports swap accounting).
    limit_swap: bool = False
    #: The execute-only loader the agent starts through (bound at ``LOADER``).
    loader: Path | None = None
    #: A user namespace made by the host (see :mod:`.userns`), mapped as below;
    #: ``None`` lets the runtime make one.
    userns: Path | None = None
    #: Seconds before an idle agent hibernates (0: never; see podbay.agent.hibernate).
    hibernate_seconds: float = 0.0
    #: The deployment's volumes (docs/volumes.md), bound last, parents first.
    volumes: tuple[VolumeBind, ...] = ()


def process_env(facts: BundleFacts) -> list[str]:
    """The container's environment: :data:`PROCESS_ENV`, and the agent's idle
    seconds before it hibernates when that is on."""
    if facts.hibernate_seconds <= 0:
        return list(PROCESS_ENV)
    return [*PROCESS_ENV, f"{HIBERNATE_ENV}={facts.hibernate_seconds:g}"]


def _bind(source: Path, destination: str, *options: str) -> dict[str, Any]:
    return {
        "destination": destination,
        "type": "bind",
        "source": str(source),
        "options": ["bind", "nosuid", "nodev", *options],
    }


def mounts(facts: BundleFacts) -> list[dict[str, Any]]:
    found = [
        {
            "destination": "/proc",
            "type": "proc",
            "source": "proc",
            "options": ["nosuid", "noexec", "nodev"],
        },
        {
            "destination": "/dev",
            "type": "tmpfs",
            "source": "tmpfs",
            "options": ["nosuid", "strictatime", "mode=755", "size=65536k"],
        },
        {
            "destination": "/dev/pts",
            "type": "devpts",
            "source": "devpts",
            "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"],
        },
        {
            "destination": "/dev/shm",
            "type": "tmpfs",
            "source": "shm",
            "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"],
        },
        {
            "destination": "/dev/mqueue",
            "type": "mqueue",
            "source": "mqueue",
            "options": ["nosuid", "noexec", "nodev"],
        },
    ]
    if facts.netns is None:
        # sysfs can only be mounted by a user namespace that owns the network namespace.
        found.append(
            {
                "destination": "/sys",
                "type": "sysfs",
                "source": "sysfs",
                "options": ["nosuid", "noexec", "nodev", "ro"],
            }
        )
    else:
        found.append(
            {
                "destination": "/sys",
                "type": "bind",
                "source": "/sys",
                "options": ["rbind", "nosuid", "noexec", "nodev", "ro"],
            }
        )
    # The machine's own cgroup (cgroup namespace), read-only: tools size themselves
    # by its limits, and other machines' cgroups stay out of sight.
    found.append(
        {
            "destination": "/sys/fs/cgroup",
            "type": "cgroup",
            "source": "cgroup",
            "options": ["nosuid", "noexec", "nodev", "relatime", "ro"],
        }
    )
    found += [
        _bind(facts.image_rootfs, IMAGE_DIR, "ro"),
        _bind(facts.agent_dir, AGENT_DIR, "ro"),
        *([_bind(facts.loader, LOADER, "ro")] if facts.loader is not None else []),
        # Staged with the loader (agent_bundle.stage_loader): no preload of the
        # sandbox's own reaches the agent when it starts or wakes through it.
        *(
            [_bind(facts.loader.with_name(NO_PRELOAD), "/etc/ld.so.preload", "ro", "noexec")]
            if facts.loader is not None
            else []
        ),
        _bind(facts.files_dir / "env.json", ENV_FILE, "ro"),
        _bind(facts.files_dir / "hostname", "/etc/hostname", "rw"),
        _bind(facts.files_dir / "hosts", "/etc/hosts", "rw"),
    ]
    if facts.resolv_conf:
        found.append(_bind(facts.files_dir / "resolv.conf", "/etc/resolv.conf", "rw"))
    # After the system's mounts, so none of theirs is made inside a volume
    # (attach keeps volumes off /etc, /dev, /proc, /sys and /.podbay anyway).
    found += [
        _bind(v.source, v.destination, "ro" if v.read_only else "rw")
        for v in sorted(facts.volumes, key=lambda v: v.destination)
    ]
    return found


def rlimits() -> list[dict[str, Any]]:
    """The container's resource limits: no core dumps, a sane number of fds."""
    # No more fds than the host process may have (the hard limit is never raised).
    nofile = min(65536, resource.getrlimit(resource.RLIMIT_NOFILE)[1])
    return [
        {"type": "RLIMIT_NOFILE", "hard": nofile, "soft": nofile},
        {"type": "RLIMIT_CORE", "hard": 0, "soft": 0},
    ]


def config(facts: BundleFacts) -> dict[str, Any]:
    namespaces: list[dict[str, str]] = [
        {"type": t} for t in ("pid", "ipc", "uts", "mount", "cgroup")
    ]
    namespaces.append(
        {"type": "user", "path": str(facts.userns)} if facts.userns else {"type": "user"}
    )
    namespaces.append(
        {"type": "network", "path": str(facts.netns)} if facts.netns else {"type": "network"}
    )
    period = 100_000
    caps = list(CAPABILITIES)
    return {
        "ociVersion": "1.0.2",
        "process": {
            "terminal": False,
            "user": {"uid": 0, "gid": 0},
            "args": facts.argv,
            "env": process_env(facts),
            "cwd": "/",
            "capabilities": {"bounding": caps, "effective": caps, "permitted": caps},
            # With a host-made user namespace the runtime inherits them instead
            # (see Runc.run_detached): setting them on the container's process would
            # need CAP_SYS_RESOURCE over a namespace host root does not own.
            **({} if facts.userns else {"rlimits": rlimits()}),
            "noNewPrivileges": True,
        },
        "root": {"path": str(facts.rootfs), "readonly": False},
        "hostname": facts.hostname,
        "mounts": mounts(facts),
        "linux": {
            "uidMappings": [{"containerID": 0, "hostID": facts.uid_base, "size": ID_RANGE}],
            "gidMappings": [{"containerID": 0, "hostID": facts.uid_base, "size": ID_RANGE}],
            "namespaces": namespaces,
            "cgroupsPath": facts.cgroup_path,
            "resources": {
                "devices": [{"allow": False, "access": "rwm"}],
                "memory": {
                    "limit": facts.memory_bytes,
                    **({"swap": facts.memory_bytes} if facts.limit_swap else {}),
                },
                "cpu": {"quota": max(1000, int(facts.cpus * period)), "period": period},
                "pids": {"limit": facts.pids},
            },
            "rootfsPropagation": "private",
            "seccomp": seccomp.profile(),
            "maskedPaths": MASKED_PATHS,
            "readonlyPaths": READONLY_PATHS,
        },
    }
