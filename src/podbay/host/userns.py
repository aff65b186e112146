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

import contextlib
import os
import secrets
import shutil
import signal
from pathlib import Path

from podbay.errors import DriverError

from .fdwait import wait_readable

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
        #: The holder's pid and the write end of its stdin (closing it ends the holder).
        self._proc: tuple[int, int] | None = None

    async def open(self) -> None:
        """Start the holder and map its namespace (the paths are then valid).

        Spawned directly and waited on through pipes and a pidfd: an asyncio
        subprocess (its transports, and a thread per child to reap it) cost
        more of the start's CPU than the holder itself."""
        argv = _holder_argv(self.owner)
        env = {"PATH": _PATH}
        exe = shutil.which(argv[0], path=_PATH)
        if exe is None:
            raise DriverError(f"cannot make the sandbox's user namespace: no {argv[0]}")
        stdin_r, stdin_w = os.pipe2(os.O_CLOEXEC)
        out_r, out_w = os.pipe2(os.O_CLOEXEC)
        try:
            self._proc = (
                os.posix_spawn(  # noqa: ASYNC221 - returns once the child is exec'd
                    exe,
                    argv,
                    env,
                    file_actions=[
                        (os.POSIX_SPAWN_DUP2, stdin_r, 0),
                        (os.POSIX_SPAWN_DUP2, out_w, 1),
                        (os.POSIX_SPAWN_DUP2, out_w, 2),
                    ],
                ),
                stdin_w,
            )
        except BaseException:
            os.close(stdin_w)
            os.close(out_r)
            raise
        finally:
            os.close(stdin_r)
            os.close(out_w)
        try:
            # "ready" is one write, so one read has all of it; else the tools' errors.
            said = await _read_until_eof_or_line(out_r, 30)
        finally:
            os.close(out_r)
        if said != b"ready\n":
            pid = self._proc[0]
            await self.close()
            err = said.decode(errors="replace").strip()
            raise DriverError(
                f"cannot make the sandbox's user namespace (holder {pid}): {err or 'no answer'}"
            )
        mapping = f"0 {self.base} {self.size}\n"
        for name in ("uid_map", "gid_map"):
            Path(f"/proc/{self._proc[0]}/{name}").write_text(mapping)  # noqa: ASYNC240 - procfs

    def _ns(self, kind: str) -> Path:
        if self._proc is None:
            raise DriverError("the sandbox's user namespace is not open")
        return Path(f"/proc/{self._proc[0]}/ns/{kind}")

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
        pid, stdin = proc
        pidfd = os.pidfd_open(pid)  # our unreaped child: the pid is still its
        os.close(stdin)  # its `read` sees the end and it exits
        try:
            exited = await wait_readable(pidfd, 10)
        except BaseException:
            exited = False
            raise
        finally:
            if not exited:  # hung, or the caller was cancelled: it must not stay
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            os.close(pidfd)
            # Reaped here, not by a watcher: after SIGKILL this waits for the
            # kernel to tear a shell down, no longer.
            os.waitpid(pid, 0)  # noqa: ASYNC222


_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"


async def _read_until_eof_or_line(fd: int, within: float) -> bytes:
    """What the holder says up to its first newline (or its end), "" on a timeout."""
    said = b""
    while not said.endswith(b"\n"):
        if not await wait_readable(fd, within):
            return b""
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        said += chunk
    return said
