"""A thin wrapper over an OCI runtime's command line (runc; crun and runsc share it).

Each call is one subprocess with ``--root`` pointing at this data directory's
own state, so two podbay installations never see each other's containers.
``run`` spawns with :func:`os.posix_spawn` so that the agent's listening
socket lands on fd 3 without a ``preexec_fn``, and waits on a pidfd.

>>> Runc("runc", Path("/tmp/r")).argv("pause", "m1")
['runc', '--root', '/tmp/r', 'pause', 'm1']
"""

from __future__ import annotations

import json
import os
import shutil
import signal
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from podbay.host.fdwait import wait_readable
from podbay.host.tools import run_tool

from ..base import DriverError
from ..network import procscan

#: The fd the container's first process finds the agent socket on.
AGENT_FD = 3


@dataclass(frozen=True)
class ContainerState:
    status: str  # "created" | "running" | "paused" (not from runc's file) | "stopped"
    pid: int


class Runc:
    def __init__(self, binary: str, root: Path) -> None:
        self.binary = binary
        self.root = root

    def argv(self, *args: str) -> list[str]:
        return [self.binary, "--root", str(self.root), *args]

    def available(self) -> str | None:
        """The runtime's resolved path, or ``None`` when it is not installed."""
        return shutil.which(self.binary)

    def command(self, *args: str) -> list[str]:
        """The command line of one call; ``args[-1]`` is the container id."""
        return self.argv(*args)

    async def call(self, *args: str, check: bool = True) -> tuple[int, str]:
        code, text = await run_tool(*self.command(*args))
        if check and code != 0:
            raise DriverError(f"{self.binary} {args[0]} {args[-1]} failed: {text}")
        return code, text

    #: The runtime hands inherited fds to the container (``--preserve-fds``), so
    #: the agent can serve on a socket the host made (fd 3).
    passes_fds = True

    def launch_argv(
        self, container_id: str, bundle: Path, netns: Path | None, image: Path | None = None
    ) -> list[str]:
        """The command that starts the container detached (``netns`` is named in
        the bundle for runc, which joins it itself); ``image``: restored from that
        checkpoint (runsc only, today)."""
        if image is not None:
            raise DriverError(f"{self.binary}: restoring a checkpoint is not supported")
        # --no-new-keyring: every sandbox's root is the same host uid, and the kernel
        # allows one uid 200 keys (kernel.keys.maxkeys), so a session keyring per
        # container would stop the 201st sandbox. The seccomp profile refuses every
        # keyring call, so the inherited keyring is out of the sandbox's reach.
        return self.argv(
            "run",
            "--detach",
            "--no-new-keyring",
            "--preserve-fds",
            "1",
            "--bundle",
            str(bundle),
            container_id,
        )

    async def run_detached(
        self,
        container_id: str,
        bundle: Path,
        agent_fd: int | None,
        log_path: Path,
        inherit_rlimits: list[dict[str, Any]] | None = None,
        *,
        netns: Path | None = None,
        image: Path | None = None,
    ) -> None:
        """Start the container detached, with ``agent_fd`` (if any) passed as fd 3;
        the container's own stdout and stderr (and the runtime's errors) go to
        ``log_path``. ``inherit_rlimits`` (OCI ``rlimits`` entries) are set on the
        runtime itself, through ``prlimit(1)``, so that the container inherits them."""
        argv = self.launch_argv(container_id, bundle, netns, image)
        exe = shutil.which(argv[0])
        if exe is None:
            raise DriverError(f"{argv[0]!r} not found on PATH")
        if inherit_rlimits:
            argv = [
                "prlimit",
                *(
                    f"--{_PRLIMIT_NAMES[r['type']]}={r['soft']}:{r['hard']}"
                    for r in inherit_rlimits
                ),
                "--",
                exe,
                *argv[1:],
            ]
            exe = shutil.which("prlimit") or "/usr/bin/prlimit"
        log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        null_fd = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        actions = [
            (os.POSIX_SPAWN_DUP2, null_fd, 0),
            (os.POSIX_SPAWN_DUP2, log_fd, 1),
            (os.POSIX_SPAWN_DUP2, log_fd, 2),
        ]
        if agent_fd is not None:
            actions.append((os.POSIX_SPAWN_DUP2, agent_fd, AGENT_FD))
        try:
            pid = os.posix_spawn(  # noqa: ASYNC221
                exe,
                argv,
                _runtime_env(),
                file_actions=actions,
            )
        finally:
            os.close(log_fd)
            os.close(null_fd)
        code = await wait_pid(pid)
        if code != 0:
            text = log_path.read_text(errors="replace")  # noqa: ASYNC240 - small, local
            tail = text.strip().splitlines()[-3:]
            raise DriverError(
                f"{self.binary} {'restore' if image else 'run'} {container_id} failed "
                f"(exit {code}): " + " | ".join(tail)
            )

    def state(self, container_id: str) -> ContainerState | None:
        """The container as runc recorded it, read from its state file (no subprocess).

        ``status`` is runc's recorded view plus a liveness check of the init pid;
        pause is reported by the cgroup freezer (see :mod:`.cgroups`)."""
        try:
            raw: dict[str, Any] = json.loads((self.root / container_id / "state.json").read_text())
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            return ContainerState("stopped", 0)
        pid = int(raw.get("init_process_pid") or 0)
        start = raw.get("init_process_start")
        if not procscan.alive(pid, start):
            return ContainerState("stopped", pid)
        if (self.root / container_id / "exec.fifo").exists():
            # runc's init is still waiting to exec the first process: "created".
            return ContainerState("created", pid)
        return ContainerState("running", pid)

    @property
    def is_runc(self) -> bool:
        """runc's state file and cgroup freezer are read and written directly (fast
        paths); other runtimes (crun, runsc) are asked through their command line."""
        return Path(self.binary).name == "runc"

    @property
    def shares_host_kernel(self) -> bool:
        """runc and crun run the sandbox on the host's kernel; runsc (gVisor) does not."""
        return Path(self.binary).name != "runsc"

    async def query(self, container_id: str) -> ContainerState | None:
        """Like :meth:`state`, for any OCI runtime (``status`` may then be "paused")."""
        if self.is_runc:
            return self.state(container_id)
        code, text = await self.call("state", container_id, check=False)
        if code != 0:
            return None
        try:
            raw = json.loads(text)
        except ValueError:
            return ContainerState("stopped", 0)
        status = str(raw.get("status") or "stopped")
        return ContainerState(status, int(raw.get("pid") or 0))

    def container_ids(self) -> list[str]:
        try:
            return sorted(p.name for p in self.root.iterdir() if p.is_dir())
        except FileNotFoundError:
            return []

    async def kill_init(
        self, container_id: str, *, thaw: Callable[[], Awaitable[None]], within: float = 5.0
    ) -> None:
        """SIGKILL the container's init (its pid namespace dies with it) and wait
        until it has exited; ``thaw`` is called after the signal, so that frozen
        processes die without running user code.

        ``runc delete --force`` does the same but sleeps 100 ms after its signal
        before looking again; a pidfd says at once. Only for runc (its state
        file names the init); other runtimes get ``delete --force`` alone."""
        state = self.state(container_id) if self.is_runc else None
        if state is None or state.status == "stopped" or state.pid <= 0:
            await thaw()
            return
        try:
            pidfd = os.pidfd_open(state.pid)
        except ProcessLookupError:
            await thaw()
            return
        try:
            current = self.state(container_id)  # the pid is still that init (not reused)
            if current is not None and current.status != "stopped":
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            await thaw()
            await wait_readable(pidfd, within)
        finally:
            os.close(pidfd)

    async def delete(self, container_id: str) -> None:
        """Kill every process and forget the container; quiet when it is gone."""
        if not (self.root / container_id).exists():
            return
        code, text = await self.call("delete", "--force", container_id, check=False)
        if code != 0 and (self.root / container_id).exists():
            raise DriverError(f"{self.binary} delete {container_id} failed: {text}")


_PRLIMIT_NAMES = {"RLIMIT_NOFILE": "nofile", "RLIMIT_CORE": "core"}


def _runtime_env() -> dict[str, str]:
    # The runtime needs no secrets and gets none: a fixed, minimal environment.
    return {
        "PATH": os.environ.get(
            "PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
        )
    }


async def wait_pid(pid: int) -> int:
    """Wait for a child without blocking the loop (pidfd), return its exit code."""
    pidfd = os.pidfd_open(pid)
    try:
        await wait_readable(pidfd)
    finally:
        os.close(pidfd)
    _, status = os.waitpid(pid, 0)  # noqa: ASYNC222 - the pidfd said it exited
    return os.waitstatus_to_exitcode(status)
