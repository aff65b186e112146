"""Each sandbox's user namespace is owned by a host uid of its own.

Why: the kernel charges per-user counters (inotify instances and watches,
POSIX message queue bytes, pending real-time signals, ...) to the user
namespace's *owner* in the parent namespace as well as to the user inside.
A namespace that runc creates as host root charges host root: all sandboxes
and root on the host would share one budget (128 inotify instances), so one
sandbox could exhaust it for every other sandbox and the host.

So the host makes the namespace first, from a small holder process that has
dropped to an unprivileged host uid chosen for this machine (no process on
the host runs as it), writes the uid and gid maps as root, and runc joins it
by path. The holder makes the machine's network namespace in the same call:
runc joins the user namespace before the network one, and from inside it can
only join a network namespace that it owns. The network code sets that
namespace up like any other (loopback, rules, slirp4netns). The holder exits
once the sandbox runs (its processes and the namespace file keep both).
Every sandbox then has the budget of one ordinary user, and root on the host
keeps its own. The owner gets no power over the host: its
uid owns no files and runs no processes; in the namespace it is what host
root is anyway.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
from pathlib import Path

from ..base import DriverError

#: Owners are drawn from ``[OWNER_UID_BASE, OWNER_UID_BASE + OWNER_UID_COUNT)``,
#: a range no installation maps into a sandbox or gives to users.
OWNER_UID_BASE = 2_000_000_000
OWNER_UID_COUNT = 1 << 24
#: The file in a machine's run directory naming its namespace's owner.
OWNER_FILE = "userns-owner"


def _holder_argv(owner: int) -> list[str]:
    """As ``owner`` (no groups, no capabilities left), unshare a user and a network
    namespace, say so, and wait for stdin to close. util-linux and a shell: a few
    milliseconds, where a Python holder took tens on a busy host."""
    return [
        "setpriv",
        f"--reuid={owner}",
        f"--regid={owner}",
        "--clear-groups",
        "--",
        "unshare",
        "--user",
        "--net",
        "--",
        "sh",
        "-c",
        "echo ready; while read -r _; do :; done",
    ]


def pick_owner(run_dirs: list[Path]) -> int:
    """A random owner uid that no machine in ``run_dirs`` has."""
    taken = set()
    for run in run_dirs:
        with contextlib.suppress(OSError, ValueError):
            taken.add(int((run / OWNER_FILE).read_text()))
    while True:
        uid = OWNER_UID_BASE + secrets.randbelow(OWNER_UID_COUNT)
        if uid not in taken:
            return uid


class OwnedUserNamespace:
    """A user namespace owned by ``owner``, mapping 0..size-1 to ``base``.., and
    a network namespace it owns; held open by a holder process until :meth:`close`."""

    def __init__(self, owner: int, base: int, size: int) -> None:
        self.owner, self.base, self.size = owner, base, size
        self._proc: asyncio.subprocess.Process | None = None

    async def open(self) -> None:
        """Start the holder and map its namespace (the paths are then valid)."""
        proc = await asyncio.create_subprocess_exec(
            *_holder_argv(self.owner),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
        )
        self._proc = proc
        assert proc.stdout is not None and proc.stderr is not None
        try:
            line = await asyncio.wait_for(proc.stdout.readline(), 30)
        except TimeoutError:
            line = b""
        if line != b"ready\n":
            await self.close()
            err = (await proc.stderr.read()).decode(errors="replace").strip()
            raise DriverError(f"cannot make the sandbox's user namespace: {err or 'no answer'}")
        mapping = f"0 {self.base} {self.size}\n"
        for name in ("uid_map", "gid_map"):
            Path(f"/proc/{proc.pid}/{name}").write_text(mapping)  # noqa: ASYNC240 - procfs

    def _ns(self, kind: str) -> Path:
        if self._proc is None:
            raise DriverError("the sandbox's user namespace is not open")
        return Path(f"/proc/{self._proc.pid}/ns/{kind}")

    @property
    def userns_path(self) -> Path:
        return self._ns("user")

    @property
    def netns_path(self) -> Path:
        """The network namespace it owns, for the network code to set up."""
        return self._ns("net")

    async def close(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            await asyncio.wait_for(proc.wait(), 10)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
