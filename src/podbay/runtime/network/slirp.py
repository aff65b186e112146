"""slirp4netns, the per-sandbox user-mode network helper.

It runs on the host (in the node's network namespace) and turns the packets a
sandbox sends on ``tap0`` into ordinary host sockets; it gets no API socket, so
no port is ever forwarded in. It is started in its own session and its pid is
recorded with its start time, so it outlives a node process killed with SIGKILL
and can be taken back (:meth:`Slirps.recorded`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import resource
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

from podbay.host.cgroups import Cgroups
from podbay.host.fdwait import wait_readable

from ...errors import NetworkError
from . import procscan
from .policy import MTU, TAP_NAME
from .slirpgroup import SlirpGroup

__all__ = [
    "LOG_FILE",
    "MAX_FDS",
    "MIN_FDS",
    "PID_FILE",
    "SlirpLimits",
    "Slirps",
    "budget",
    "version",
]

PID_FILE = "slirp.pid"
LOG_FILE = "slirp.log"
#: The fewest descriptors a slirp4netns is given: its own (tap, namespace, log,
#: epoll ...) take ~10, and a sandbox needs a few dozen connections to be useful.
MIN_FDS = 64
#: The most: the kernel's default ``fs.nr_open``, above which RLIMIT_NOFILE fails.
MAX_FDS = 1 << 20


@dataclass(frozen=True)
class SlirpLimits:
    """What one sandbox's slirp4netns may use on the host.

    Every connection a sandbox opens is a host socket in its slirp4netns, which
    runs outside the sandbox's cgroup: without limits one sandbox's 15,000
    connections took it to 3.8 GiB. ``cgroup_parent/<machine id>`` holds it
    (memory, pids, CPU), and RLIMIT_NOFILE caps its sockets. A sandbox that
    exhausts it loses its own network: further connections fail, or at the
    memory limit the kernel ends that slirp4netns (``adopt`` starts a new one).
    """

    cgroup_parent: str
    memory_bytes: int = 128 * 1024 * 1024
    max_fds: int = 4096
    pids: int = 32
    cpus: float = 0.5


#: Memory a slirp4netns needs beside its connections (its code, heap, tap ring).
BASE_BYTES = 32 * 1024 * 1024
#: Memory per open connection, with room: a flood measured ~28-34 KiB each
#: (socket buffers, libslirp's state), so 128 MiB ended it at ~3,900.
BYTES_PER_FD = 40 * 1024


def budget(cgroup_parent: str, max_fds: int) -> SlirpLimits:
    """Each slirp4netns's budget under ``cgroup_parent``, with ``max_fds``
    (``runtime.slirp_max_fds``) refused out of range.

    Its memory grows with the descriptors it may hold, so a flood meets the
    descriptor cap (new connections fail, the open ones live on) before the
    memory limit (the kernel ends slirp4netns: every connection is lost).
    """
    if not MIN_FDS <= max_fds <= MAX_FDS:
        raise NetworkError(f"runtime.slirp_max_fds must be {MIN_FDS} to {MAX_FDS}, not {max_fds}")
    return SlirpLimits(
        cgroup_parent=cgroup_parent,
        max_fds=max_fds,
        memory_bytes=BASE_BYTES + BYTES_PER_FD * max_fds,
    )


class Slirps:
    """Starts, finds and stops the slirp4netns of each namespace file."""

    def __init__(
        self,
        binary: str = "slirp4netns",
        *,
        sandbox: bool = True,
        ready_timeout: float = 5.0,
        limits: SlirpLimits | None = None,
    ) -> None:
        self.binary = binary
        #: Each slirp4netns's own budget; ``None``: unlimited (tests of this module).
        self.limits = limits
        #: slirp4netns --enable-sandbox --enable-seccomp: its own mount namespace,
        #: capabilities dropped, a syscall filter.
        self.sandbox = sandbox
        self.ready_timeout = ready_timeout
        self._children: dict[int, subprocess.Popen[bytes]] = {}

    def argv(
        self,
        netns: Path,
        ready_fd: int,
        resolv_conf: Path | None = None,
        cgroup_procs: Path | None = None,
    ) -> list[str]:
        """``resolv_conf``: a file slirp4netns is to see as ``/etc/resolv.conf``
        (its DNS forwarder asks that file's first nameserver, :mod:`.slirpdns`).
        ``cgroup_procs``: a cgroup's ``cgroup.procs`` it writes its own pid to
        before it execs slirp4netns (with ``resolv_conf`` only)."""
        argv = [
            self.binary,
            "--configure",
            f"--mtu={MTU}",
            "--disable-host-loopback",
            "--netns-type=path",
            f"--ready-fd={ready_fd}",
        ]
        if resolv_conf is not None:
            # A mount namespace of its own (private throughout, so nothing
            # propagates back to the host) with the file over /etc/resolv.conf
            # (over its target, if a link); --enable-sandbox then binds /etc and
            # /run recursively, the file with them. sh and mount exec in place:
            # the pid stays slirp4netns's.
            options = ("--enable-sandbox", "--enable-seccomp") if self.sandbox else ()
            if cgroup_procs is not None:
                # In its cgroup before slirp4netns exists: every socket it makes
                # is the cgroup's (the name check's redirect, :mod:`.slirpgroup`).
                script = (
                    'echo $$ > "$0" && mount --bind -- "$1" /etc/resolv.conf && shift && exec "$@"'
                )
                return [
                    *("unshare", "--mount", "--propagation", "private", "--"),
                    *("sh", "-c", script),
                    str(cgroup_procs),
                    str(resolv_conf),
                    *argv,
                    *options,
                    str(netns),
                    TAP_NAME,
                ]
            return [
                *("unshare", "--mount", "--propagation", "private", "--"),
                *("sh", "-c", 'mount --bind -- "$0" /etc/resolv.conf && exec "$@"'),
                str(resolv_conf),
                *argv,
                *options,
                str(netns),
                TAP_NAME,
            ]
        if not self.sandbox:
            return [*argv, str(netns), TAP_NAME]
        # --enable-sandbox makes "/" private (not recursively) in a mount namespace
        # copied from ours, pivots and detaches the old root. Where the host's
        # mounts are shared (systemd's default), that detach propagates back and
        # unmounts every shared leaf mount on the host (/dev/shm, other tools'
        # overlays). A namespace made private throughout first keeps it in there;
        # unshare execs slirp4netns in place, so the pid stays slirp4netns's.
        return [
            *("unshare", "--mount", "--propagation", "private", "--"),
            *argv,
            "--enable-sandbox",
            "--enable-seccomp",
            str(netns),
            TAP_NAME,
        ]

    async def start(
        self,
        directory: Path,
        netns: Path,
        *,
        up: asyncio.Event | None = None,
        resolv_conf: Path | None = None,
        group: SlirpGroup | None = None,
    ) -> int:
        """Start one for ``netns``, record it in ``directory``, wait until tap0 is up
        (then ``up`` is set) and its budget is applied. ``resolv_conf``: see
        :meth:`argv`. ``group``: a v2 cgroup it is in before ``up`` is set, so
        that every socket it makes for the sandbox is that group's
        (:mod:`.slirpgroup`)."""
        procs = None
        if group is not None and resolv_conf is not None:
            try:
                procs = group.prepare()
            except OSError as exc:
                raise NetworkError(f"cannot make the cgroup {group.directory}: {exc}") from exc
        read_end, write_end = os.pipe2(os.O_CLOEXEC)
        try:
            with open(directory / LOG_FILE, "ab", buffering=0) as log:  # noqa: ASYNC230
                # Its own session: no terminal signal or process-group kill of the
                # node reaches it, and it outlives a node killed with SIGKILL.
                proc = subprocess.Popen(  # noqa: ASYNC220 - must not be an asyncio child
                    self.argv(netns, write_end, resolv_conf, procs),
                    pass_fds=(write_end,),
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=log,
                    cwd="/",
                    env={"PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")},
                    start_new_session=True,
                )
        except OSError as exc:
            os.close(read_end)
            os.close(write_end)
            raise NetworkError(f"cannot start {self.binary}: {exc}") from exc
        os.close(write_end)
        self._children[proc.pid] = proc
        # Its budget is set while it brings tap0 up (a cgroup move waits for an RCU
        # grace period), and before this returns: no sandbox command runs before,
        # so it has served nothing of theirs (a sandbox may be booting, see ``up``).
        confined = asyncio.ensure_future(asyncio.to_thread(self._confine, directory.name, proc.pid))
        # Joined by its own shell before exec when it has one; otherwise here.
        joined = asyncio.ensure_future(
            asyncio.to_thread(group.join, proc.pid)
            if group is not None and procs is None
            else asyncio.sleep(0)
        )
        try:
            self._write_pidfile(directory, proc.pid)
            ready = await self._read_ready(read_end)
            # Before the sandbox may send: a socket made outside the group
            # would escape the name check's redirect.
            await joined
            if ready and up is not None:
                up.set()
            await confined
        except BaseException:
            # A thread cannot be cancelled: it finishes before the process is stopped.
            with contextlib.suppress(BaseException):
                await asyncio.shield(confined)
            with contextlib.suppress(BaseException):
                await asyncio.shield(joined)
            await self.stop(proc.pid)
            raise
        finally:
            os.close(read_end)
        if not ready:
            await self.stop(proc.pid)
            raise NetworkError(
                f"slirp4netns for {directory.name} was not ready within "
                f"{self.ready_timeout:g}s or exited: {log_tail(directory)}"
            )
        return proc.pid

    def _confine(self, machine_id: str, pid: int) -> None:
        if self.limits is None:
            return
        limits = self.limits
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (limits.max_fds, limits.max_fds))
        Cgroups().confine(
            self.cgroup(machine_id),
            pid,
            memory_bytes=limits.memory_bytes,
            pids=limits.pids,
            cpus=limits.cpus,
        )

    async def _read_ready(self, fd: int) -> bool:
        if not await wait_readable(fd, self.ready_timeout):
            return False
        # "1" once tap0 is configured; EOF if it died first.
        return os.read(fd, 16).startswith(b"1")

    @staticmethod
    def _write_pidfile(directory: Path, pid: int) -> None:
        start = procscan.start_time(pid) or "0"
        tmp = directory / f".{PID_FILE}.tmp"
        tmp.write_text(f"{pid} {start}\n")
        os.replace(tmp, directory / PID_FILE)

    def cgroup(self, machine_id: str) -> str:
        assert self.limits is not None
        return f"{self.limits.cgroup_parent}/{machine_id}"

    def remove_cgroup(self, machine_id: str) -> None:
        if self.limits is not None:
            Cgroups().remove(self.cgroup(machine_id))

    def recorded(self, directory: Path, netns: Path) -> int | None:
        """The pid file's slirp, if that pid is still that same slirp4netns."""
        self.reap()
        try:
            pid_text, start = (directory / PID_FILE).read_text().split()
            pid = int(pid_text)
        except (OSError, ValueError):
            return None
        if not procscan.alive(pid, start) or not serves(pid, netns):
            return None
        return pid

    def reap(self) -> None:
        for children in (self._children, _LEFT_RUNNING):
            for pid, proc in list(children.items()):
                if proc.poll() is not None:
                    del children[pid]

    def forget(self) -> None:
        """Let go of the children without stopping anything (slirps outlive the
        node). Their handles stay with this process (:data:`_LEFT_RUNNING`): a
        handle collected while its child runs is a ResourceWarning, and a child
        that ends later must still be reaped, by whichever manager of this
        process (a node started again in it, a test) adopts or stops it."""
        _LEFT_RUNNING.update(self._children)
        self._children.clear()

    async def stop(self, pid: int) -> None:
        """SIGTERM, then SIGKILL after a second; through a pidfd, so never a reused pid."""
        try:
            pidfd = os.pidfd_open(pid)
        except ProcessLookupError:
            self.reap()
            return
        try:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(pidfd, signal.SIGTERM)
            if not await wait_readable(pidfd, 1.0):
                with contextlib.suppress(ProcessLookupError):
                    signal.pidfd_send_signal(pidfd, signal.SIGKILL)
                await wait_readable(pidfd, 5.0)
        finally:
            os.close(pidfd)
        proc = self._children.pop(pid, None) or _LEFT_RUNNING.pop(pid, None)
        if proc is not None:
            proc.wait()


#: slirp4netns children of this process that a closed manager let go of.
_LEFT_RUNNING: dict[int, subprocess.Popen[bytes]] = {}


def serves(pid: int, netns: Path) -> bool:
    """``pid`` is a slirp4netns attached to exactly this namespace file."""
    argv = procscan.cmdline(pid)
    return bool(argv) and argv[0].endswith("slirp4netns") and str(netns) in argv[1:]


def find(netns: Path) -> list[int]:
    """slirp4netns processes serving this namespace file (no pid file needed)."""
    return procscan.find(lambda pid: serves(pid, netns))


def log_tail(directory: Path) -> str:
    try:
        text = (directory / LOG_FILE).read_text(errors="replace").strip()
    except OSError:
        return "(no log)"
    return " | ".join(text.splitlines()[-3:]) or "(empty log)"


def version(binary: str) -> tuple[int, int] | None:
    try:
        out = subprocess.run(
            [binary, "--version"], capture_output=True, text=True, timeout=5, check=False
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.search(r"slirp4netns version (\d+)\.(\d+)", out)
    return (int(match.group(1)), int(match.group(2))) if match else None
