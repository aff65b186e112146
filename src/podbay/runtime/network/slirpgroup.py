"""The cgroup (v2) that tells one gVisor sandbox's slirp4netns sockets apart.

gVisor's netstack writes frames to ``tap0``, which no nat hook sees; its TCP
connections leave the host as ordinary sockets of its slirp4netns, in the
host's own network namespace, where the nat ``output`` hook does apply. To
send those (and only those) to the sandbox's name check, a redirect in the
host's namespace matches the socket's cgroup (``socket cgroupv2 level N
"path"``): a socket belongs to the cgroup its process was in when it made it,
so slirp4netns joins a v2 cgroup of its own before ``tap0`` carries anything.

That cgroup is ``<slirp's budget cgroup path>`` (``<parent>/<machine id>``,
the same directory as the budget on a v2-only host) in the v2 hierarchy,
wherever that is mounted (``/sys/fs/cgroup``, or ``/sys/fs/cgroup/unified``
beside v1 controllers); without a budget, ``/podbay-names/<machine id>``.
nft reads the path relative to ``/sys/fs/cgroup`` and resolves it to the
cgroup's id when the rule is loaded: a cgroup removed and made again needs
the rule loaded again.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path

__all__ = ["DEFAULT_PARENT", "NFT_ROOT", "SlirpGroup", "v2_root"]

#: What nft puts in front of a ``socket cgroupv2`` path.
NFT_ROOT = Path("/sys/fs/cgroup")
#: The parent when slirp4netns has no budget (tests of the network alone).
DEFAULT_PARENT = "/podbay-names"


def v2_root(mountinfo: str | None = None) -> Path | None:
    """Where the cgroup v2 hierarchy is mounted, or ``None`` (a v1-only host)."""
    if mountinfo is None:
        try:
            mountinfo = Path("/proc/self/mountinfo").read_text()
        except OSError:
            return None
    for line in mountinfo.splitlines():
        fields = line.split()
        if " - " not in line or len(fields) < 5:
            continue
        fstype = line.split(" - ", 1)[1].split()[0]
        if fstype == "cgroup2":
            return Path(fields[4])
    return None


@dataclass(frozen=True)
class SlirpGroup:
    """One machine's slirp4netns cgroup in the v2 hierarchy."""

    root: Path
    path: str

    @classmethod
    def of(cls, parent: str | None, machine_id: str, root: Path | None = None) -> SlirpGroup | None:
        root = root if root is not None else v2_root()
        if root is None:
            return None
        return cls(root, f"{(parent or DEFAULT_PARENT).strip('/')}/{machine_id}")

    @property
    def directory(self) -> Path:
        return self.root / self.path

    @property
    def level(self) -> int:
        """Its depth below the hierarchy's root (what ``level`` compares)."""
        return len(self.path.split("/"))

    def match(self) -> str:
        """The nft expression that matches a socket made inside it."""
        relative = os.path.relpath(self.directory, NFT_ROOT)
        return f'socket cgroupv2 level {self.level} "{relative}"'

    def prepare(self) -> Path:
        """Make it; its ``cgroup.procs`` (a process that writes its pid there
        is in it from then on)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        return self.directory / "cgroup.procs"

    def join(self, pid: int) -> None:
        """Make it and move ``pid`` in (its later sockets are the group's)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        (self.directory / "cgroup.procs").write_text(str(pid))

    def remove(self) -> None:
        """Remove it once empty (its parent stays: others may share it)."""
        with contextlib.suppress(FileNotFoundError, OSError):
            self.directory.rmdir()
