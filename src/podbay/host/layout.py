"""Where a data directory keeps what: one place that names every path.

Persistent (survives reboots), under ``data_dir``::

    images/<recipe>/rootfs        the shared base image (or ``runtime.image_dir``)
    agent/<hash>/podbay/...       the staged agent
    machines/<id>/machine.json    spec + commanded state
    machines/<id>/disk.ext4       the writable layer's filesystem (sparse)
    volumes/<deployment>/<name>/  a volume: volume.json, disk.ext4 (.volumes)

Volatile (a reboot ends every machine), under ``run_dir`` — by default
``/run/podbay/<hash of data_dir>``, short enough for unix socket paths::

    runc/                         the OCI runtime's state (``--root``)
    agent/, gvisor-shim/          runsc only: copies its sandboxes can reach
    volumes/<deployment>/<name>/  a volume's mount point (.volumes)
    neutral/image-<key>/, neutral/agent-<hash>/
                                  read-only views of the image and the agent: the
                                  sandboxes' bind sources (storage.neutral_view)
    <id>/config.json, rootfs/     the bundle; rootfs is the overlay mount
    <id>/disk/                    the ext4 mount: upper/, work/ and host/
    <id>/disk/host/               env.json, hosts, hostname, resolv.conf, console.log
    <id>/agent.sock               the listening socket the agent serves on
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from podbay.settings import Settings
from podbay.wire.limits import SANDBOX_CLASS_NAMES

#: The cgroup over every data directory's sandboxes and helpers on this node
#: (its pids limit leaves the host pids of its own, see ``Cgroups.cap_pids``).
NODE_CGROUP = "/podbay"

#: A machine's run directory: others may pass through, not list it.
RUN_MODE = 0o711

#: Entries of a run directory that are no machine's: ``gc`` must never take
#: them for a dead machine's leftovers (it removed a live server's gvisor shim,
#: and every gVisor start failed after). Machine ids never take these names.
RUNC_DIR = "runc"
AGENT_COPY_DIR = "agent"
SHIM_DIR = "gvisor-shim"
NEUTRAL_DIR = "neutral"
#: Volumes (:mod:`.volumes`): their files under ``data_dir``, their mount
#: points under ``run_dir``.
VOLUMES_DIR = "volumes"
SHARED_RUN_ENTRIES = frozenset(
    {RUNC_DIR, AGENT_COPY_DIR, SHIM_DIR, NEUTRAL_DIR, VOLUMES_DIR, *SANDBOX_CLASS_NAMES}
)


def instance_id(data_dir: Path) -> str:
    """Short stable name of a data directory (run dir and cgroup components)."""
    return hashlib.sha256(str(data_dir.resolve()).encode()).hexdigest()[:10]


@dataclass(frozen=True)
class Layout:
    data_dir: Path
    image_dir: Path
    run_dir: Path
    instance: str

    @classmethod
    def from_settings(cls, settings: Settings) -> Layout:
        data_dir = settings.data_dir.resolve()
        instance = instance_id(data_dir)
        rt = settings.runtime
        image_dir = Path(rt.image_dir) if rt.image_dir else data_dir / "images"
        run_dir = Path(rt.run_dir) if rt.run_dir else Path("/run/podbay") / instance
        return cls(data_dir, image_dir, run_dir, instance)

    # One named property per directory (alike in shape to MachinePaths on purpose).
    @property
    def machines(self) -> Path:
        return self.data_dir / "machines"

    @property
    def volumes(self) -> Path:
        return self.data_dir / VOLUMES_DIR

    @property
    def volume_mounts(self) -> Path:
        return self.run_dir / VOLUMES_DIR

    @property
    def runc_root(self) -> Path:
        return self.run_dir / RUNC_DIR

    @property
    def neutral(self) -> Path:
        """Read-only views of the image and the agent, the sandboxes' bind sources."""
        return self.run_dir / NEUTRAL_DIR

    @property
    def cgroup_parent(self) -> str:
        return f"{NODE_CGROUP}/{self.instance}"

    def machine(self, machine_id: str) -> MachinePaths:
        return MachinePaths(
            self.machines / machine_id,
            self.run_dir / machine_id,
            f"{self.cgroup_parent}/{machine_id}",
        )


@dataclass(frozen=True)
class MachineDirs:
    """A machine's two directories and what every driver keeps in them."""

    home: Path  # persistent
    run: Path  # volatile

    @property
    def disk_image(self) -> Path:
        return self.home / "disk.ext4"

    @property
    def socket(self) -> Path:
        return self.run / "agent.sock"


# Layout, MachinePaths, vm's VmPaths and Template are alike in shape on
# purpose: one named property per file or directory, so each path has one home.
@dataclass(frozen=True)
class MachinePaths(MachineDirs):
    cgroup: str

    def make_run(self) -> None:
        """Make the run directory traverse-only for others, whatever the umask: the
        sandbox's own processes (runc's init, runsc's gofer and sandbox) are
        unprivileged on the host and pass through it to their root filesystem."""
        self.run.mkdir(mode=RUN_MODE, parents=True, exist_ok=True)
        os.chmod(self.run, RUN_MODE)

    @property
    def disk_mount(self) -> Path:
        return self.run / "disk"

    @property
    def rootfs(self) -> Path:
        return self.run / "rootfs"

    @property
    def files(self) -> Path:
        """Host files bound into the sandbox: on its disk, beside ``upper/``."""
        return self.disk_mount / "host"

    @property
    def console(self) -> Path:
        """The agent's stdout/stderr: a sandbox root can write to them, so they live
        on its disk (bounded by its quota), not on the host's ``/run``."""
        return self.disk_mount / "host" / "console.log"
