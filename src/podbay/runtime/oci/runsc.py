"""gVisor's ``runsc``: what it needs beyond runc's command line.

- **Global flags.** ``--root`` (this data directory's state), ``--platform``
  (:func:`choose_platform`), ``--network=sandbox`` (gVisor's own network stack,
  so a sandbox's sockets never reach the host kernel's), ``--host-uds=create``
  (the agent's socket, below) and ``--overlay2=none`` (writes go to the
  machine's own disk, so stop keeps them).
- **The network namespace.** runsc's sandbox joins the host-owned namespace
  named in ``config.json`` and takes over its ``tap0`` through a packet
  socket; the egress policy then holds at ``tap0``'s egress hook (see
  :mod:`podbay.runtime.network.policy`). This runsc refuses to start when
  ``/proc/sys/net/core/rmem_default`` exists, its test for "the host's root
  namespace"; kernels since 6.5 have that file in every namespace. So runsc
  starts inside the machine's namespace (``nsenter --net``) and in a mount
  namespace of its own where a read-only empty tmpfs covers that directory
  (``/proc/sys/net`` is per network namespace, so the cover applies there
  only). ``ip netns exec`` would remount /sys and hide the cgroups.
  ``runsc_enter.c`` (built at install: :mod:`..native`) does all of that in
  one exec (nsenter, unshare, sh and two mounts otherwise).
- **The agent's socket.** runsc hands the container only stdio, and an
  imported listening socket cannot ``accept`` inside gVisor, so the agent
  binds ``/.podbay/run/agent.sock`` in a directory bound from the host
  (``--host-uds=create`` lets the gofer make it a real host socket). Once
  it answers, the host moves the socket file to the machine's run directory,
  out of the sandbox's sight: whatever sandbox code binds later in that
  directory is never what the gateway connects to.
- **Pause** is the cgroup freezer on the sandbox's host cgroup, as for runc:
  the sentry, its gofer and the platform's stub processes are host processes
  in that cgroup, and freezing them all stops the sandbox whole (memory
  kept; a thaw lets it run on). ``runsc pause`` and ``runsc resume`` are two
  Go process starts talking to the sentry (27-40 ms each); resume still uses
  ``runsc resume`` for a sandbox an older podbay paused that way. While the
  cgroup is frozen no ``runsc`` command may run against the sandbox (each
  waits for the sentry): the driver reads state from runsc's state file
  (:meth:`Runsc.query`) and thaws before it deletes.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
import stat
import subprocess
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from podbay.host.fdwait import close_watch, drain, wait_readable, watch_created
from podbay.host.layout import AGENT_COPY_DIR, SHIM_DIR
from podbay.host.tools import check_tool

from ..base import DriverError
from ..native import NATIVE_DIR, STAMP, built
from ..network import procscan
from ..network.netns import enter_argv, is_mounted
from ..readiness import wait_ready
from .namer import SCRIPT as NAMER_SCRIPT
from .namer import Namer
from .runc import ContainerState, Runc

#: Where the agent's socket directory is bound inside a gVisor sandbox.
SOCKET_DIR = "/.podbay/run"
SOCKET_NAME = "agent.sock"
#: An empty directory in the bundle where runsc's own mount namespace gets a
#: second procfs (see ``_MASK_ROOT_NETNS_TEST``).
PROC_DIR = "proc"

#: How long a killed sandbox or gofer may take to exit (a big sandbox's memory
#: takes a while to free).
END_WAIT_S = 10.0

#: Reads of a state file that does not parse (runsc rewriting it) before asking
#: ``runsc state``.
STATE_READS = 5

#: How long a gofer may take to finish its sandbox's last requests and exit.
GOFER_GRACE_S = 2.0

#: Preference order: systrap (runsc since mid-2023) traps syscalls with seccomp
#: and no ptrace stops; kvm runs the sentry as a guest (needs a working KVM);
#: ptrace works everywhere.
PLATFORMS = ("systrap", "kvm", "ptrace")

# Covering a directory of /proc makes that mount "not fully visible", and the kernel
# then refuses procfs to any user namespace below (runsc's gofer mounts one): a
# second, uncovered procfs mounted on an empty directory keeps one fully visible.
_MASK_ROOT_NETNS_TEST = (
    'mount -t proc -o nosuid,nodev,noexec podbay "$0" && '
    "mount -t tmpfs -o ro,size=4k,mode=555 podbay /proc/sys/net/core "
    '&& exec "$@"'
)

log = logging.getLogger("podbay.runtime.oci")


class Runsc(Runc):
    passes_fds = False

    def __init__(
        self, binary: str, root: Path, *, platform: str, netns: Callable[[str], Path]
    ) -> None:
        super().__init__(binary, root)
        self.platform = platform
        #: runsc_enter.c built (:func:`stage_statx_shim`): starts runsc in one exec.
        self.enter: Path | None = None
        #: The machine's network namespace file. runsc reaches a sandbox through
        #: an abstract unix socket, which exists only in the sandbox's network
        #: namespace, so every command for it runs there.
        self.netns = netns

    def command(self, *args: str) -> list[str]:
        # The container id is the last argument, but for ``kill ID SIGNAL``.
        path = self.netns(args[-2] if args[0] == "kill" else args[-1])
        return [*enter_argv(path), *self.argv(*args)] if is_mounted(path) else self.argv(*args)

    def argv(self, *args: str) -> list[str]:
        return [
            self.binary,
            "--root",
            str(self.root),
            f"--platform={self.platform}",
            "--network=sandbox",
            "--host-uds=create",
            "--overlay2=none",
            *args,
        ]

    def launch_argv(
        self, container_id: str, bundle: Path, netns: Path | None, image: Path | None = None
    ) -> list[str]:
        start = ["run"] if image is None else ["restore", "--image-path", str(image)]
        run = self.argv(*start, "--detach", "--bundle", str(bundle), container_id)
        if netns is None:
            return run
        visible_proc = bundle / PROC_DIR
        visible_proc.mkdir(mode=0o700, exist_ok=True)
        if self.enter is not None:  # the same in one exec (runsc_enter.c)
            return [str(self.enter), str(netns), str(visible_proc), *run]
        return [
            *enter_argv(netns),
            "unshare",
            "--mount",
            "--propagation",
            "slave",
            "--",
            "sh",
            "-c",
            _MASK_ROOT_NETNS_TEST,
            str(visible_proc),
            *run,
        ]

    def privileged(self, container_id: str, *command: str) -> list[str]:
        """``runsc exec`` of ``command`` as root with the one capability a
        hostname needs (gVisor keeps the sandbox's UTS namespace in its own kernel)."""
        return [
            *self.command(container_id)[:-1],
            "exec",
            "--user",
            "0:0",
            "--cap",
            "CAP_SYS_ADMIN",
            container_id,
            *command,
        ]

    async def set_hostname(self, container_id: str, hostname: str) -> None:
        """Set it from a process started inside."""
        argv = self.privileged(container_id, "/bin/hostname", hostname)
        await check_tool(*argv, failed="setting hostname failed")

    async def namer(self, container_id: str, program: str | None) -> Namer:
        """The same, started now and named later (:mod:`.namer`): by ``program``
        (:data:`NAMER_IN_SANDBOX`) where the sandbox has it, else the image's
        shell and ``hostname``."""
        command = [program] if program else ["/bin/sh", "-c", NAMER_SCRIPT]
        process = await asyncio.create_subprocess_exec(
            *self.privileged(container_id, *command),
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        return Namer(process)

    async def _end(self, container_id: str, *, paused_only: bool) -> bool:
        """End the container here: its sandbox, then its gofer, are killed through
        pidfds and waited for, and its state files removed. ``False`` (nothing
        done) when its state names no process to end, or it is not paused and
        ``paused_only``.

        This runsc panics deleting a paused container ("invalid state transition:
        paused => stopped") and leaves it running. And ``runsc delete`` kills the
        sandbox, then polls every 100 ms until the pid is gone, while a killed
        sandbox stays a zombie until the host's init reaps it (``runsc run`` left
        it to init), seconds on some hosts: a delete took 1.1-1.5 s, the processes
        3-30 ms to exit. But a file changed inside just before was found changed
        back after a fast end and a new start (1 in 3: a chmod), never after
        ``runsc delete``: so the fast end is for what is discarded anyway."""
        state_file = self._state_file(container_id)
        try:
            raw = json.loads(state_file.read_text())
            pids = [int((raw.get("sandbox") or {}).get("pid") or 0), int(raw.get("goferPid") or 0)]
            paused = raw.get("status") == "paused"
        except (OSError, ValueError, TypeError, AttributeError):
            return False
        if not any(pid > 0 for pid in pids) or (paused_only and not paused):
            return False
        # The sandbox first. Its gofer then finishes what the sandbox asked of it
        # (a write or chmod just done inside is on its way to the host's disk) and
        # exits once the sandbox's connections close; killed only if it lingers.
        for pid, grace in zip(pids, (0.0, GOFER_GRACE_S), strict=True):
            await _kill_runsc(pid, container_id, grace)
        for path in (state_file, state_file.with_suffix(".lock")):
            path.unlink(missing_ok=True)
        return True

    def _state_file(self, container_id: str) -> Path:
        return self.root / f"{container_id}_sandbox:{container_id}.state"

    async def query(self, container_id: str) -> ContainerState | None:
        """The container as runsc recorded it, read from its state file, and its
        sandbox process alive: what ``runsc state`` answers, without it. That is
        a Go process start (27-40 ms, on every suspend, resume and pool hand-out
        before), and it waits for the sentry's answer, which never comes while
        the sandbox's cgroup is frozen (how the driver suspends it). A file
        caught while runsc rewrites it is read again; ``runsc state`` only
        answers when it still does not parse."""
        state_file = self._state_file(container_id)
        for attempt in range(STATE_READS):
            try:
                raw = json.loads(state_file.read_text())
                status = str(raw["status"])
                pid = int((raw.get("sandbox") or {}).get("pid") or 0)
            except FileNotFoundError:
                return None
            except (OSError, ValueError, TypeError, KeyError, AttributeError):
                await asyncio.sleep(0.002 * (attempt + 1))
                continue
            if status in ("created", "running", "paused") and not sandbox_alive(pid, container_id):
                return ContainerState("stopped", pid)
            return ContainerState(status, pid)
        return await super().query(container_id)

    def container_ids(self) -> list[str]:
        """Containers with state under ``--root`` (runsc keeps one ``.state`` file each)."""
        try:
            names = [p.name for p in self.root.iterdir()]
        except FileNotFoundError:
            return []
        return sorted(
            n.split("_sandbox:", 1)[0] for n in names if n.endswith(".state") and "_sandbox:" in n
        )

    async def delete(self, container_id: str, *, discard: bool = False) -> None:
        """Kill and forget the container; ``discard``: its files are not kept (a
        destroy), so it may end fast (see :meth:`_end`)."""
        state_file = self._state_file(container_id)
        if not state_file.exists():
            return
        if await self._end(container_id, paused_only=not discard):
            return
        code, text = await self.call("delete", "--force", container_id, check=False)
        if code != 0 and self._state_file(container_id).exists():
            raise DriverError(f"{self.binary} delete {container_id} failed: {text}")


async def _kill_runsc(pid: int, container_id: str, grace: float) -> None:
    """Wait up to ``grace`` s for ``pid`` to exit, then SIGKILL it and wait (only
    while it is this container's runsc process: a pidfd keeps the check exact)."""
    if pid <= 0:
        return
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        if not _runsc_process_of(pid, container_id):
            return
        if grace > 0 and await wait_readable(pidfd, grace):
            return
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        await wait_readable(pidfd, END_WAIT_S)
    finally:
        os.close(pidfd)


def sandbox_alive(pid: int, container_id: str) -> bool:
    """``pid`` is the live sandbox process (the sentry) of ``container_id``."""
    return pid > 0 and procscan.alive(pid) and _runsc_process_of(pid, container_id)


def _runsc_process_of(pid: int, container_id: str) -> bool:
    argv = procscan.cmdline(pid)
    return bool(argv) and argv[0].startswith("runsc") and container_id in " ".join(argv)


def reachable(path: Path) -> bool:
    """Every directory above ``path`` lets others through: runsc's sandbox process
    runs as ``nobody`` and opens bind mounts' sources itself."""
    return all(os.stat(parent).st_mode & stat.S_IXOTH for parent in path.resolve().parents)


def reachable_agent(agent_dir: Path, run_dir: Path) -> Path:
    """``agent_dir``, or a copy of it under ``run_dir`` (traverse-only) when
    runsc's sandbox could not reach it (a data directory private to root)."""
    if reachable(agent_dir):
        return agent_dir
    target = run_dir / AGENT_COPY_DIR / agent_dir.name
    if (target / "complete").exists():
        return target
    target.parent.mkdir(mode=0o755, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(agent_dir, tmp, symlinks=True)
    return _publish(tmp, target)


def _publish(tmp: Path, target: Path) -> Path:
    """Mark the tree made at ``tmp`` complete and move it to ``target`` in one
    rename; a tree made there concurrently is as good, so ours is dropped."""
    (tmp / "complete").touch()
    try:
        os.rename(tmp, target)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


#: Where the statx shim (statx_shim.c) appears inside a gvisor sandbox.
SHIM_IN_SANDBOX = "/.podbay/statx-shim.so"
#: Where the agent's launcher of commands (podbay/agent/launcher.c, built
#: statically) appears inside a gvisor sandbox.
LAUNCHER_IN_SANDBOX = "/.podbay/launcher"
#: Where the program that names a pooled sandbox (namer.c) appears inside one.
NAMER_IN_SANDBOX = "/.podbay/namer"
#: Where the hibernating agent's waiter (podbay/agent/waiter.c) appears inside one.
WAITER_IN_SANDBOX = "/.podbay/waiter"
#: The programs a gvisor run directory gets a copy of (runsc-enter: host only).
STAGED_PROGRAMS = ("statx-shim.so", "launcher", "namer", "waiter", "runsc-enter")


def stage_statx_shim(run_dir: Path, *, native: Path = NATIVE_DIR) -> Path:
    """The directory holding the statx shim and an ``ld.so.preload`` naming
    it, the agent's launcher and ``runsc-enter`` (:meth:`Runsc.launch_argv`),
    copied once per build from the prebuilt programs (:mod:`..native`) under
    the traverse-only ``run_dir`` runsc's gofer can reach. A missing or stale
    build is a :class:`DriverError` naming the step that builds it."""
    source = built(native)
    digest = (source / STAMP).read_text().strip()
    target = run_dir / SHIM_DIR / digest
    if (target / "complete").exists():
        return target
    target.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(mode=0o755)
    for name in STAGED_PROGRAMS:
        shutil.copy2(source / name, tmp / name)  # modes kept: as the build made them
    (tmp / "ld.so.preload").write_text(SHIM_IN_SANDBOX + "\n")
    os.chmod(tmp / "ld.so.preload", 0o644)
    return _publish(tmp, target)


def adapt_config(
    cfg: dict[str, Any],
    socket_dir: Path,
    shim: Path | None = None,
    *,
    volumes: frozenset[str] = frozenset(),
) -> dict[str, Any]:
    """runc's ``config.json`` made right for runsc (pure).

    gVisor's sysfs and cgroupfs are its own, so /sys is not bound from the host;
    the agent's socket directory is bound read-write. Read-only binds are
    marked as the sandbox's alone (:func:`exclusive_hints`). ``shim``: the
    statx shim's directory (:func:`stage_statx_shim`), preloaded everywhere.
    ``volumes``: the destinations of volume binds, never marked the sandbox's
    alone (another sandbox or the files API may write them: gVisor asks its
    gofer again, so each sees the others' writes, docs/volumes.md)."""
    mounts: list[dict[str, Any]] = []
    for mount in cfg["mounts"]:
        if mount["destination"] == "/sys":
            mount = {
                "destination": "/sys",
                "type": "sysfs",
                "source": "sysfs",
                "options": ["nosuid", "noexec", "nodev", "ro"],
            }
        mounts.append(mount)
    mounts.append(
        {
            "destination": SOCKET_DIR,
            "type": "bind",
            "source": str(socket_dir),
            "options": ["bind", "nosuid", "nodev", "noexec", "rw"],
        }
    )
    if shim is not None:
        for name, destination in (
            ("statx-shim.so", SHIM_IN_SANDBOX),
            ("ld.so.preload", "/etc/ld.so.preload"),
            ("launcher", LAUNCHER_IN_SANDBOX),
            ("namer", NAMER_IN_SANDBOX),
            ("waiter", WAITER_IN_SANDBOX),
        ):
            if not (shim / name).exists():
                continue
            mounts.append(
                {
                    "destination": destination,
                    "type": "bind",
                    "source": str(shim / name),
                    "options": ["bind", "nosuid", "nodev", "ro"],
                }
            )
    exclusive = [m for m in mounts if m["destination"] not in volumes]
    annotations = {**cfg.get("annotations", {}), **exclusive_hints(exclusive)}
    return guest_pids({**cfg, "mounts": mounts, "annotations": annotations})


#: gVisor's host threads per sandbox (ptrace platform, runsc 20221219), counted
#: in its host cgroup: idle about 70-100 (the sentry's Go threads, the gofer);
#: each guest process adds its address space's stub process with a tracee
#: thread per sentry thread that ever ran it, and stubs and threads stay
#: pooled after it exits: about 12 per ``sleep``, 22-57 per process slot in a
#: fork bomb at the guest's limit (peaks 251, 842, 1266-1882, 3180 host
#: threads at limits 8, 16, 32, 64; 12543 at 256 when its 512 MiB ended it).
#: A sh fork bomb at 96 guest processes (load ~10, 2026-12): 6,312 host threads
#: (66 per process slot) and 263 MiB of the sandbox's memory; at 160 it passed
#: 64 per slot and gVisor, unable to make a stub thread, ended the sandbox.
HOST_PIDS_IDLE = 384
HOST_PIDS_PER_GUEST = 100
#: The same threads are what fills the sandbox's memory: each costs the host
#: kernel memory (stack, task, page tables) charged to the sandbox's cgroup,
#: about 2.1 MiB per guest process slot in that bomb (beyond ~60 MiB for the
#: sentry and the agent), and more under heavier load (more sentry threads run
#: each stub): at load ~34, 149 slots (3 MiB each) filled 512 MiB. gVisor (2022)
#: has no OOM killer: a guest that reaches the cgroup's limit ends the whole
#: sandbox, so the guest's pids limit is also capped at what its memory holds
#: at 4 MiB a slot (:func:`guest_pids_cap`).
HOST_BYTES_BASE = 64 << 20
HOST_BYTES_PER_GUEST = 4 << 20
#: The cap never goes below this (a tiny sandbox still runs a shell and a pipe).
GUEST_PIDS_FLOOR = 16


def host_pids(guest: int) -> int:
    """The host pids budget of a gVisor sandbox whose guest holds at most
    ``guest`` processes (:func:`guest_pids`): so large that a guest at its
    limit does not reach it (gVisor cannot make a thread there and the whole
    sandbox ends): 1.3 times the worst measured.

    >>> host_pids(256)
    25984
    """
    return HOST_PIDS_IDLE + HOST_PIDS_PER_GUEST * guest


def guest_pids_cap(memory_bytes: int) -> int:
    """The most guest processes a gVisor sandbox of ``memory_bytes`` holds with
    its host-side cost inside that memory (see :data:`HOST_BYTES_PER_GUEST`).

    >>> guest_pids_cap(512 << 20), guest_pids_cap(1 << 30), guest_pids_cap(64 << 20)
    (112, 240, 16)
    """
    return max(GUEST_PIDS_FLOOR, (memory_bytes - HOST_BYTES_BASE) // HOST_BYTES_PER_GUEST)


def guest_pids(cfg: dict[str, Any]) -> dict[str, Any]:
    """The sandbox's pids limit moved from the host into the guest (pure): the
    guarded agent confines commands to a pids cgroup of gVisor's kernel holding
    that many (``--pids-max``, see :mod:`podbay.agent.guestpids`), granted
    ``CAP_SYS_ADMIN`` to make it (it drops it at once, before anything runs),
    and the host's cgroup gets :func:`host_pids` of it. The limit is at most
    :func:`guest_pids_cap` of the sandbox's memory, so a fork bomb at it cannot
    end the sandbox."""
    process, resources = cfg["process"], cfg["linux"]["resources"]
    if "--guard-uid" not in process["args"] or "pids" not in resources:
        return cfg
    limit = int(resources["pids"]["limit"])
    if "memory" in resources:
        limit = min(limit, guest_pids_cap(int(resources["memory"]["limit"])))
    caps = {k: [*v, "CAP_SYS_ADMIN"] for k, v in process["capabilities"].items()}
    process = {
        **process,
        "args": [*process["args"], "--pids-max", str(limit)],
        "capabilities": caps,
    }
    resources = {**resources, "pids": {"limit": host_pids(limit)}}
    return {**cfg, "process": process, "linux": {**cfg["linux"], "resources": resources}}


#: gVisor's mount hints (annotations ``dev.gvisor.spec.mount.<name>.<field>``).
MOUNT_HINT = "dev.gvisor.spec.mount"


def exclusive_hints(mounts: list[dict[str, Any]]) -> dict[str, str]:
    """Mount hints that let gVisor cache the read-only binds (the pristine image,
    the agent's code, its env file) as it caches the root filesystem.

    By default gVisor asks its gofer again about every path it looks up in a
    bind mount (another process on the host might have changed it); the
    agent's start-up looks up hundreds of paths in the image and the agent's
    code, so that costs much of a sandbox's start. These sources never change
    while a sandbox runs (the image and the staged agent are immutable, the env
    file is written before the start), so ``share=container`` (gVisor's
    "exclusive" access) is safe for them. Binds the host rewrites while the
    sandbox runs (hostname, hosts, the socket directory) keep revalidating."""
    hints: dict[str, str] = {}
    binds = [m for m in mounts if m.get("type") == "bind" and "ro" in m.get("options", ())]
    for index, mount in enumerate(binds):
        prefix = f"{MOUNT_HINT}.podbay{index}"
        hints[f"{prefix}.source"] = mount["source"]
        hints[f"{prefix}.type"] = "bind"
        hints[f"{prefix}.share"] = "container"
    return hints


async def wait_bound(
    bound: Path, final: Path, within: float, *, alive: Callable[[], Awaitable[bool]]
) -> None:
    """Wait until the agent listens on ``bound`` and answers there, then move the
    socket file to ``final`` (host only). Raises :class:`DriverError`, at once
    when ``alive()`` says the sandbox is gone.

    The file's creation is watched (inotify, else polled every 10 ms at most:
    ~5 ms of each start lost on average). It appears at ``bind``, a moment
    before ``listen``: until then a connection is refused, so refusals are
    retried after a short sleep."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    # runsc state costs a process start: ask only once the wait is long.
    delay, next_check = 0.002, loop.time() + 1.0
    watch = watch_created(bound.parent)  # before the first look: no creation missed
    try:
        while True:
            now = loop.time()
            if now > deadline:
                raise DriverError(f"the agent did not listen within {within:.0f} s")
            present = bound.is_socket()  # noqa: ASYNC240 - one stat on tmpfs
            if present:
                try:
                    await wait_ready(bound, max(0.1, deadline - now))
                    break
                except DriverError as e:
                    if "Connection refused" not in str(e):
                        raise
            if now > next_check:
                if not await alive():
                    raise DriverError("the sandbox exited before its agent listened")
                next_check = now + 1.0
            if watch is None or present:
                await asyncio.sleep(delay)
                delay = min(delay * 1.5, 0.01)
            else:
                await wait_readable(watch, max(0.0, min(next_check, deadline) - loop.time()))
                drain(watch)
    finally:
        if watch is not None:
            close_watch(watch)
    os.replace(bound, final)


def available_platforms(binary: str) -> list[str]:
    """The platforms this runsc build knows (``runsc help platforms``)."""
    try:
        out = subprocess.run(
            [binary, "help", "platforms"], capture_output=True, text=True, timeout=10, check=False
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line.strip() for line in out.splitlines() if line.strip().isidentifier()]


def choose_platform(
    binary: str, wanted: str = "", *, cache: Path = Path("/run/podbay/runsc-platform.json")
) -> str:
    """``wanted`` if set; else the first of :data:`PLATFORMS` this runsc has and
    this host runs. kvm counts only when a sandbox actually starts on it (a
    device node is no proof: on some hosts KVM guests hang); that probe takes
    up to 10 s, so its answer is kept in ``cache`` for this runsc and kernel."""
    if wanted:
        return wanted
    resolved = shutil.which(binary)
    if resolved is None:
        return "ptrace"
    st = os.stat(resolved)
    key = {
        "runsc": resolved,
        "size": st.st_size,
        "mtime": st.st_mtime_ns,
        "kernel": os.uname().release,
    }
    with contextlib.suppress(OSError, ValueError):
        known = json.loads(cache.read_text())
        if isinstance(known, dict) and known.get("key") == key:
            return str(known["platform"])
    platforms = available_platforms(resolved)
    chosen = "ptrace"
    for platform in PLATFORMS:
        if platform in platforms and (platform != "kvm" or _kvm_runs(resolved)):
            chosen = platform
            break
    with contextlib.suppress(OSError):
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_name(f".{cache.name}.{os.getpid()}")
        tmp.write_text(json.dumps({"key": key, "platform": chosen}))
        os.replace(tmp, cache)
    return chosen


def _kvm_runs(binary: str) -> bool:
    if not Path("/dev/kvm").exists():
        return False
    with tempfile.TemporaryDirectory(prefix="podbay-kvm-probe-") as root:
        argv = [binary, "--root", root, "--platform=kvm", "--network=none", "do", "true"]
        try:
            done = subprocess.run(
                argv, capture_output=True, timeout=10, check=False, stdin=subprocess.DEVNULL
            )
            return done.returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            return False
        finally:
            # A hung probe's sandbox must not outlive it.
            listed = subprocess.run(
                [binary, "--root", root, "list", "-quiet"],
                capture_output=True,
                text=True,
                check=False,
            ).stdout
            for container in listed.split():
                subprocess.run(
                    [binary, "--root", root, "delete", "-force", container],
                    capture_output=True,
                    check=False,
                )
