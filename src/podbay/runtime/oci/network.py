"""Per-sandbox networking: a host-owned network namespace, slirp4netns and nftables.

Every machine gets a network namespace that the *host* creates, in the host's
initial user namespace. The sandbox runs in its own user namespace and only
joins this network namespace, so it holds no capability over it: it cannot
change addresses, routes or the nftables rules loaded here, and it cannot open
raw or packet sockets that would bypass them.

Inside the namespace::

    lo          up (the sandbox's own loopback works, IPv4 and IPv6)
    tap0        10.0.2.100/24 from slirp4netns, default route via 10.0.2.2,
                DNS at 10.0.2.3, MTU 65520, no IPv6
    table inet podbay
        output  lo: accept; DNS to 10.0.2.3:53 (udp, tcp): accept;
                private, shared, link-local, metadata, multicast, reserved
                ranges and every address the host has: reject (TCP reset,
                otherwise ICMP admin-prohibited, so clients fail at once);
                any other IPv6 off lo: reject; other IPv4: accept
        input   lo and replies to the sandbox's own connections only
        forward drop

slirp4netns runs on the host (in the node's network namespace) and turns the
sandbox's packets into ordinary host sockets; it gets no API socket, so no port
is ever forwarded in. It is started in its own session and its pid is recorded,
so it outlives a node process killed with SIGKILL and :meth:`NetworkManager.adopt`
takes it back.

The namespace is persisted as a bind-mounted nsfs file,
``<run_dir>/<machine_id>/netns``; the OCI driver names that path as the
container's network namespace and writes :data:`RESOLV_CONF` as the sandbox's
``/etc/resolv.conf``. See ``docs/network.md``.

Everything here needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN in the initial user
namespace).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import errno
import fcntl
import ipaddress
import os
import re
import shutil
import signal
import socket
import struct
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from ..base import DriverError, check_machine_id
from .fdwait import wait_readable

__all__ = [
    "BLOCKED_IPV4",
    "BLOCKED_IPV6",
    "DISABLED_RESOLV_CONF",
    "RESOLV_CONF",
    "SANDBOX_ADDRESS",
    "SLIRP_DNS",
    "SLIRP_GATEWAY",
    "NetworkError",
    "NetworkHandle",
    "NetworkManager",
    "build_ruleset",
    "host_addresses",
]

#: slirp4netns's fixed layout (its default ``--cidr=10.0.2.0/24``).
SANDBOX_ADDRESS = "10.0.2.100"
SLIRP_GATEWAY = "10.0.2.2"
SLIRP_DNS = "10.0.2.3"
TAP_NAME = "tap0"
MTU = 65520

#: ``/etc/resolv.conf`` for a sandbox with networking: slirp's DNS forwarder.
RESOLV_CONF = f"nameserver {SLIRP_DNS}\noptions edns0\n"
#: ``/etc/resolv.conf`` for a loopback-only sandbox: resolvers fall back to
#: 127.0.0.1, where nothing answers, so lookups fail at once instead of timing out.
DISABLED_RESOLV_CONF = "# podbay: this sandbox has no network\n"

#: Destinations a sandbox never reaches (besides the host's own addresses).
BLOCKED_IPV4: tuple[str, ...] = (
    "0.0.0.0/8",  # "this network"
    "10.0.0.0/8",  # private; also slirp's gateway 10.0.2.2, which is the host
    "100.64.0.0/10",  # carrier-grade NAT (shared)
    "127.0.0.0/8",  # loopback, when not through lo
    "169.254.0.0/16",  # link-local, cloud metadata
    "172.16.0.0/12",  # private
    "192.0.0.0/24",  # IETF protocol assignments
    "192.168.0.0/16",  # private
    "198.18.0.0/15",  # benchmarking
    "224.0.0.0/4",  # multicast
    "240.0.0.0/4",  # reserved, and 255.255.255.255
)
BLOCKED_IPV6: tuple[str, ...] = (
    "::/128",
    "::1/128",
    "::ffff:0:0/96",  # IPv4-mapped
    "64:ff9b::/96",  # NAT64 (would map onto IPv4 ranges above)
    "fc00::/7",  # unique local
    "fe80::/10",  # link-local
    "ff00::/8",  # multicast
)

_NETNS_FILE = "netns"
_PID_FILE = "slirp.pid"
_LOG_FILE = "slirp.log"
_TABLE = "podbay"


class NetworkError(DriverError):
    """Setting up or tearing down a sandbox's network failed."""


@dataclass(frozen=True, kw_only=True)
class NetworkHandle:
    """What the driver needs to put a container on this network."""

    machine_id: str
    #: Bind-mounted nsfs file: the OCI config's network namespace ``path``.
    netns_path: Path
    #: slirp4netns process id; ``None`` when networking is disabled.
    slirp_pid: int | None
    #: Content for the sandbox's ``/etc/resolv.conf``.
    resolv_conf: str
    #: Outbound internet (slirp + rules) rather than loopback only.
    enabled: bool
    #: Seconds :meth:`NetworkManager.setup` took (0 for an adopted network).
    setup_seconds: float = 0.0


# --------------------------------------------------------------------------- host facts


def host_addresses() -> tuple[list[ipaddress.IPv4Network], list[ipaddress.IPv6Network]]:
    """Every address the calling thread's network namespace has, on any interface.

    Read from ``/proc`` (no subprocess): IPv4 from the kernel's local routes in
    ``fib_trie`` (``host LOCAL`` entries, which include whole local prefixes such as
    127.0.0.0/8), IPv6 from ``if_inet6``.
    """
    v4: set[ipaddress.IPv4Network] = set()
    v6: set[ipaddress.IPv6Network] = set()
    base = Path("/proc/thread-self/net")
    if not base.exists():  # pragma: no cover - very old kernels
        base = Path("/proc/self/net")
    last: str | None = None
    with contextlib.suppress(OSError), (base / "fib_trie").open() as f:
        for line in f:
            s = line.strip()
            if s.startswith("|--"):
                last = s[3:].strip()
            elif last and s.startswith("/") and s.endswith("host LOCAL"):
                prefix = s.split()[0][1:]
                with contextlib.suppress(ValueError):
                    v4.add(ipaddress.IPv4Network(f"{last}/{prefix}", strict=False))
    with contextlib.suppress(OSError), (base / "if_inet6").open() as f:
        for line in f:
            fields = line.split()
            if fields and len(fields[0]) == 32:
                packed = bytes.fromhex(fields[0])
                v6.add(ipaddress.IPv6Network(ipaddress.IPv6Address(packed)))
    return sorted(v4), sorted(v6)


def build_ruleset(
    host_v4: Iterable[ipaddress.IPv4Network | str] = (),
    host_v6: Iterable[ipaddress.IPv6Network | str] = (),
    extra_blocked: Iterable[str] = (),
    *,
    replace: bool = False,
) -> str:
    """The nftables batch loaded inside a sandbox's namespace, as one atomic transaction.

    With ``replace`` it first swaps out an earlier ``inet podbay`` table (create,
    delete, create in one batch), which refreshes the host addresses of a running
    sandbox with no moment unfiltered. Deleting a table makes the kernel wait for
    an RCU grace period (10-25 ms here), so a fresh namespace loads it without.
    """
    v4: list[ipaddress.IPv4Network] = [ipaddress.IPv4Network(n) for n in BLOCKED_IPV4]
    v6: list[ipaddress.IPv6Network] = [ipaddress.IPv6Network(n) for n in BLOCKED_IPV6]
    v4 += [ipaddress.IPv4Network(n, strict=False) for n in host_v4]
    v6 += [ipaddress.IPv6Network(n, strict=False) for n in host_v6]
    for item in extra_blocked:
        net = ipaddress.ip_network(item, strict=False)
        if isinstance(net, ipaddress.IPv4Network):
            v4.append(net)
        else:
            v6.append(net)
    # Interval sets refuse overlapping elements: merge first.
    e4 = ", ".join(str(n) for n in ipaddress.collapse_addresses(v4))
    e6 = ", ".join(str(n) for n in ipaddress.collapse_addresses(v6))
    swap = f"table inet {_TABLE}\ndelete table inet {_TABLE}\n" if replace else ""
    return f"""\
{swap}table inet {_TABLE} {{
\tset blocked_v4 {{
\t\ttype ipv4_addr
\t\tflags interval
\t\telements = {{ {e4} }}
\t}}
\tset blocked_v6 {{
\t\ttype ipv6_addr
\t\tflags interval
\t\telements = {{ {e6} }}
\t}}
\tchain output {{
\t\ttype filter hook output priority filter; policy drop;
\t\toifname "lo" accept
\t\tip daddr {SLIRP_DNS} udp dport 53 counter accept comment "dns-udp"
\t\tip daddr {SLIRP_DNS} tcp dport 53 counter accept comment "dns-tcp"
\t\tip daddr @blocked_v4 meta l4proto tcp counter reject with tcp reset comment "blocked"
\t\tip daddr @blocked_v4 counter reject with icmp type admin-prohibited comment "blocked"
\t\tip6 daddr @blocked_v6 meta l4proto tcp counter reject with tcp reset comment "blocked"
\t\tip6 daddr @blocked_v6 counter reject with icmpv6 type admin-prohibited comment "blocked"
\t\tmeta nfproto ipv6 meta l4proto tcp counter reject with tcp reset comment "ipv6-off"
\t\tmeta nfproto ipv6 counter reject with icmpv6 type admin-prohibited comment "ipv6-off"
\t\tmeta nfproto ipv4 accept
\t\tcounter drop comment "other"
\t}}
\tchain input {{
\t\ttype filter hook input priority filter; policy drop;
\t\tiifname "lo" accept
\t\tct state established,related accept
\t\tcounter drop comment "inbound"
\t}}
\tchain forward {{
\t\ttype filter hook forward priority filter; policy drop;
\t}}
}}
"""


# --------------------------------------------------------------------------- syscalls

_CLONE_NEWNET = 0x40000000
_MS_BIND = 0x1000
_MNT_DETACH = 0x2
_SIOCGIFFLAGS = 0x8913
_SIOCSIFFLAGS = 0x8914
_IFF_UP = 0x1

_libc: Any = None


def _lib() -> Any:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    return _libc


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def _unshare_net() -> None:
    _check(_lib().unshare(_CLONE_NEWNET), "unshare(CLONE_NEWNET)")


def _setns(fd: int) -> None:
    _check(_lib().setns(fd, _CLONE_NEWNET), "setns")


def _bind_mount(source: str, target: str) -> None:
    _check(_lib().mount(source.encode(), target.encode(), None, _MS_BIND, None), "mount")


def _umount_all(target: Path) -> None:
    """Detach every mount stacked on ``target``; a path that is not a mount is fine."""
    for _ in range(16):
        if _lib().umount2(str(target).encode(), _MNT_DETACH) != 0:
            err = ctypes.get_errno()
            if err in (errno.EINVAL, errno.ENOENT):
                return
            raise OSError(err, f"umount {target}: {os.strerror(err)}")


def _is_nsfs_mount(path: Path) -> bool:
    try:
        return os.stat(path).st_dev == os.stat("/proc/self/ns/net").st_dev
    except OSError:
        return False


def _lo_up() -> None:
    """Bring ``lo`` up in the calling thread's network namespace (ioctl, no subprocess)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        req = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(s, _SIOCGIFFLAGS, req))[1]
        fcntl.ioctl(s, _SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | _IFF_UP))


def _sysctl(name: str, value: str) -> None:
    # /proc/sys/net resolves against the *calling thread's* network namespace.
    with open(f"/proc/sys/{name.replace('.', '/')}", "w") as f:
        f.write(value)


class _Nft:
    """nftables through libnftables (in process, ~1 ms) or the ``nft`` binary."""

    _lib: Any = None
    _tried = False
    _lock = threading.Lock()

    @classmethod
    def library(cls) -> Any:
        with cls._lock:
            if not cls._tried:
                cls._tried = True
                try:
                    lib = ctypes.CDLL("libnftables.so.1")
                    lib.nft_ctx_new.restype = ctypes.c_void_p
                    lib.nft_ctx_new.argtypes = [ctypes.c_uint32]
                    lib.nft_ctx_free.argtypes = [ctypes.c_void_p]
                    lib.nft_ctx_buffer_output.argtypes = [ctypes.c_void_p]
                    lib.nft_ctx_buffer_error.argtypes = [ctypes.c_void_p]
                    lib.nft_ctx_get_error_buffer.argtypes = [ctypes.c_void_p]
                    lib.nft_ctx_get_error_buffer.restype = ctypes.c_char_p
                    lib.nft_run_cmd_from_buffer.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
                    lib.nft_run_cmd_from_buffer.restype = ctypes.c_int
                    cls._lib = lib
                except (OSError, AttributeError):
                    cls._lib = None
            return cls._lib

    @classmethod
    def run(cls, batch: str) -> None:
        """Load ``batch`` in the calling thread's network namespace, or raise."""
        lib = cls.library()
        if lib is not None:
            ctx = lib.nft_ctx_new(0)
            if not ctx:
                raise OSError(errno.ENOMEM, "nft_ctx_new failed")
            try:
                lib.nft_ctx_buffer_output(ctx)
                lib.nft_ctx_buffer_error(ctx)
                if lib.nft_run_cmd_from_buffer(ctx, batch.encode()) != 0:
                    message = (lib.nft_ctx_get_error_buffer(ctx) or b"").decode(errors="replace")
                    raise OSError(errno.EINVAL, f"nft: {message.strip()}")
            finally:
                lib.nft_ctx_free(ctx)
            return
        # A child forked from this thread inherits the thread's network namespace.
        done = subprocess.run(
            ["nft", "-f", "-"], input=batch.encode(), capture_output=True, check=False
        )
        if done.returncode != 0:
            raise OSError(errno.EINVAL, f"nft: {done.stderr.decode(errors='replace').strip()}")


T = TypeVar("T")


def _in_fresh_thread(fn: Callable[[], T]) -> asyncio.Future[T]:
    """Run ``fn`` on a new OS thread that exits afterwards.

    Namespace changes (unshare, setns) apply to one thread only; a thread of its
    own means a half-done change can never leak into the event loop or a pool.
    """
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[T] = loop.create_future()

    def settle(result: Any, exc: BaseException | None) -> None:
        if fut.done():
            return
        if exc is not None:
            fut.set_exception(exc)
        else:
            fut.set_result(result)

    def run() -> None:
        try:
            result = fn()
        except BaseException as exc:
            loop.call_soon_threadsafe(settle, None, exc)
        else:
            loop.call_soon_threadsafe(settle, result, None)

    threading.Thread(target=run, name="podbay-netns", daemon=True).start()
    return fut


# --------------------------------------------------------------------------- processes


def _proc_start_time(pid: int) -> str | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # Field 22; the command name (field 2) may contain spaces and parentheses.
    return stat.rsplit(")", 1)[1].split()[19]


def _proc_cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def _is_slirp_for(pid: int, netns_path: Path) -> bool:
    argv = _proc_cmdline(pid)
    return bool(argv) and argv[0].endswith("slirp4netns") and str(netns_path) in argv[1:]


def _find_slirps(netns_path: Path) -> list[int]:
    """slirp4netns processes serving exactly this namespace file (no pid file needed)."""
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and _is_slirp_for(int(entry.name), netns_path):
            found.append(int(entry.name))
    return found


# --------------------------------------------------------------------------- the manager


class NetworkManager:
    """Creates, adopts and removes the network of each machine under ``run_dir``.

    ``run_dir/<machine_id>/`` holds ``netns`` (the nsfs bind mount), ``slirp.pid``
    (``"<pid> <start time>"``) and ``slirp.log``. With ``enabled=False`` a machine
    gets a namespace with only ``lo``: no slirp, no route anywhere.

    ``extra_blocked`` adds destinations (CIDRs) no sandbox may reach, e.g. a
    control plane or database on a public address elsewhere.
    """

    def __init__(
        self,
        run_dir: Path,
        enabled: bool = True,
        *,
        extra_blocked: Sequence[str] = (),
        slirp_binary: str = "slirp4netns",
        slirp_sandbox: bool = True,
        ready_timeout: float = 5.0,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.enabled = enabled
        self.extra_blocked = tuple(extra_blocked)
        for item in self.extra_blocked:
            ipaddress.ip_network(item, strict=False)  # fail early on a typo
        self.slirp_binary = slirp_binary
        #: slirp4netns --enable-sandbox --enable-seccomp: its own mount namespace,
        #: capabilities dropped, a syscall filter.
        self.slirp_sandbox = slirp_sandbox
        self.ready_timeout = ready_timeout
        self._locks: dict[str, asyncio.Lock] = {}
        self._children: dict[int, subprocess.Popen[bytes]] = {}

    # -- paths

    def machine_dir(self, machine_id: str) -> Path:
        return self.run_dir / check_machine_id(machine_id)

    def netns_path(self, machine_id: str) -> Path:
        """Where the machine's namespace is (or will be) mounted."""
        return self.machine_dir(machine_id) / _NETNS_FILE

    def machines(self) -> list[str]:
        """Machine ids with network state under ``run_dir`` (for garbage collection)."""
        try:
            entries = list(os.scandir(self.run_dir))
        except FileNotFoundError:
            return []
        return sorted(
            e.name
            for e in entries
            if e.is_dir(follow_symlinks=False)
            and any((Path(e.path) / name).exists() for name in (_NETNS_FILE, _PID_FILE))
        )

    # -- public API

    async def setup(self, machine_id: str) -> NetworkHandle:
        """Create the machine's namespace, load its rules, start slirp4netns.

        Idempotent: a complete network that already exists is adopted and
        returned; a partial one is removed and built again. On failure nothing is
        left behind and :class:`NetworkError` is raised.
        """
        async with self._lock(machine_id):
            existing = await self._adopt(machine_id)
            if existing is not None:
                return existing
            if self.machine_dir(machine_id).exists():
                await self._teardown(machine_id)  # leftovers of a failed attempt
            started = time.perf_counter()
            try:
                pid = await self._create(machine_id)
            except BaseException as exc:
                with contextlib.suppress(Exception):
                    await asyncio.shield(self._teardown(machine_id))
                if isinstance(exc, NetworkError | asyncio.CancelledError):
                    raise
                if isinstance(exc, Exception):
                    raise NetworkError(f"network setup for {machine_id} failed: {exc}") from exc
                raise
            return self._handle(machine_id, pid, time.perf_counter() - started)

    async def teardown(self, machine_id: str) -> None:
        """Stop slirp4netns, unmount and remove the namespace file and the directory.

        Idempotent; call it after the container is gone (a process still inside
        would keep the kernel namespace alive, though unreachable from outside).
        """
        async with self._lock(machine_id):
            await self._teardown(machine_id)

    async def adopt(self, machine_id: str) -> NetworkHandle | None:
        """Take back a machine's network after the node process restarted.

        Returns ``None`` when its namespace no longer exists (the caller should
        rebuild the machine). Otherwise reloads the rules (refreshing the host's
        addresses), checks that the recorded slirp4netns is still that process
        serving that namespace, and starts a new one if it died.
        """
        async with self._lock(machine_id):
            return await self._adopt(machine_id)

    async def refresh(self, machine_id: str) -> None:
        """Reload the machine's rules, e.g. after the host gained an address."""
        path = self.netns_path(machine_id)
        if not _is_nsfs_mount(path):
            raise NetworkError(f"{machine_id} has no network namespace")
        if self.enabled:
            await self._apply_rules(path)

    def resolv_conf(self) -> str:
        """``/etc/resolv.conf`` content for this manager's sandboxes."""
        return RESOLV_CONF if self.enabled else DISABLED_RESOLV_CONF

    def check_host(self) -> list[str]:
        """Problems that stop networking here, each with a one-line remedy (for doctor)."""
        problems: list[str] = []
        if os.geteuid() != 0:
            problems.append(
                "network: not running as root; per-sandbox network namespaces need "
                "CAP_SYS_ADMIN and CAP_NET_ADMIN: run the node as root"
            )
            return problems
        try:
            self._probe_namespace(rules=self.enabled)
        except OSError as exc:
            if "nft" in str(exc):
                problems.append(
                    f"network: the kernel refused the sandbox firewall ({exc}); "
                    "enable nf_tables with reject and conntrack (modprobe nf_tables "
                    "nft_reject_inet nft_ct) or use a kernel that has them"
                )
            else:
                problems.append(
                    f"network: cannot create a network namespace ({exc}); run as root "
                    "on a kernel with CONFIG_NET_NS"
                )
        if not self.enabled:
            return problems
        if _Nft.library() is None and shutil.which("nft") is None:
            problems.append("network: nftables missing: apt-get install nftables")
        slirp = shutil.which(self.slirp_binary)
        if slirp is None:
            problems.append("network: slirp4netns missing: apt-get install slirp4netns")
        else:
            version = _slirp_version(slirp)
            if version is None or version < (1, 1):
                problems.append(
                    f"network: slirp4netns {version or 'of unknown version'} is too old "
                    "(need >= 1.1): install slirp4netns from Debian 12 or newer"
                )
        if not os.path.exists("/dev/net/tun"):
            problems.append("network: /dev/net/tun missing: modprobe tun")
        problems += _resolver_problems(Path("/etc/resolv.conf"), self.slirp_sandbox)
        return problems

    async def close(self) -> None:
        """Forget child processes without stopping them (slirps outlive the node)."""
        self._children.clear()

    # -- internals

    def _lock(self, machine_id: str) -> asyncio.Lock:
        check_machine_id(machine_id)
        lock = self._locks.get(machine_id)
        if lock is None:
            lock = self._locks[machine_id] = asyncio.Lock()
        return lock

    def _handle(self, machine_id: str, pid: int | None, seconds: float = 0.0) -> NetworkHandle:
        return NetworkHandle(
            machine_id=machine_id,
            netns_path=self.netns_path(machine_id),
            slirp_pid=pid,
            resolv_conf=self.resolv_conf(),
            enabled=self.enabled,
            setup_seconds=seconds,
        )

    def _ruleset(self, *, replace: bool = False) -> str:
        v4, v6 = host_addresses()
        return build_ruleset(v4, v6, self.extra_blocked, replace=replace)

    async def _create(self, machine_id: str) -> int | None:
        directory = self.machine_dir(machine_id)
        self.run_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        directory.mkdir(mode=0o700, exist_ok=True)
        path = directory / _NETNS_FILE
        rules = self._ruleset() if self.enabled else None
        loop = asyncio.get_running_loop()
        mounted: asyncio.Future[None] = loop.create_future()

        def settle() -> None:
            if not mounted.done():
                mounted.set_result(None)

        def signal_mounted() -> None:
            loop.call_soon_threadsafe(settle)

        def build() -> None:
            # This thread becomes the namespace's first member, then exits.
            _unshare_net()
            fd = os.open(path, os.O_RDONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            os.close(fd)
            _bind_mount("/proc/thread-self/ns/net", str(path))
            _lo_up()
            # tap0 gets no IPv6 (slirp's is off); lo keeps ::1. Set before slirp
            # may start (signal_mounted), or slirp's tap0 can beat it.
            with contextlib.suppress(FileNotFoundError):  # IPv6 off at boot
                _sysctl("net.ipv6.conf.default.disable_ipv6", "1")
            signal_mounted()
            if rules is not None:
                _Nft.run(rules)

        built = _in_fresh_thread(build)
        try:
            if not self.enabled:
                await built
                return None
            # slirp needs only the mounted file; the rules load meanwhile. Both are
            # done before setup returns, so no sandbox process ever runs unfiltered.
            await asyncio.wait({mounted, built}, return_when=asyncio.FIRST_COMPLETED)
            if built.done() and built.exception() is not None:
                await built  # raises
            slirp = asyncio.ensure_future(self._start_slirp(machine_id))
            try:
                await built
            except BaseException:
                slirp.cancel()
                with contextlib.suppress(BaseException):
                    await slirp
                raise
            return await slirp
        except BaseException:
            # Cancelled or failed: let the thread finish before anyone cleans up,
            # or it could mount after the cleanup ran.
            with contextlib.suppress(BaseException):
                await asyncio.shield(built)
            raise

    async def _apply_rules(self, path: Path) -> None:
        rules = self._ruleset(replace=True)

        def enter_and_load() -> None:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                _setns(fd)
            finally:
                os.close(fd)
            _Nft.run(rules)

        await _in_fresh_thread(enter_and_load)

    def _slirp_argv(self, path: Path, ready_fd: int) -> list[str]:
        argv = [
            self.slirp_binary,
            "--configure",
            f"--mtu={MTU}",
            "--disable-host-loopback",
            "--netns-type=path",
            f"--ready-fd={ready_fd}",
        ]
        if self.slirp_sandbox:
            argv += ["--enable-sandbox", "--enable-seccomp"]
        return [*argv, str(path), TAP_NAME]

    async def _start_slirp(self, machine_id: str) -> int:
        directory = self.machine_dir(machine_id)
        path = directory / _NETNS_FILE
        read_end, write_end = os.pipe2(os.O_CLOEXEC)
        try:
            with open(directory / _LOG_FILE, "ab", buffering=0) as log:  # noqa: ASYNC230
                # Its own session: no terminal signal or process-group kill of the
                # node reaches it, and it outlives a node killed with SIGKILL.
                proc = subprocess.Popen(  # noqa: ASYNC220 - must not be an asyncio child
                    self._slirp_argv(path, write_end),
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
            raise NetworkError(f"cannot start {self.slirp_binary}: {exc}") from exc
        os.close(write_end)
        self._children[proc.pid] = proc
        try:
            self._write_pidfile(directory, proc.pid)
            ready = await self._read_ready(read_end)
        except BaseException:
            await self._stop_slirp(proc.pid)
            raise
        finally:
            os.close(read_end)
        if not ready:
            await self._stop_slirp(proc.pid)
            raise NetworkError(
                f"slirp4netns for {machine_id} was not ready within {self.ready_timeout:g}s "
                "or exited: "
                f"{self._log_tail(directory)}"
            )
        return proc.pid

    async def _read_ready(self, fd: int) -> bool:
        if not await wait_readable(fd, self.ready_timeout):
            return False
        # "1" once tap0 is configured; EOF if it died first.
        return os.read(fd, 16).startswith(b"1")

    def _write_pidfile(self, directory: Path, pid: int) -> None:
        start = _proc_start_time(pid) or "0"
        tmp = directory / f".{_PID_FILE}.tmp"
        tmp.write_text(f"{pid} {start}\n")
        os.replace(tmp, directory / _PID_FILE)

    def _recorded_slirp(self, machine_id: str) -> int | None:
        """The pid file's slirp, if that pid is still that same slirp4netns."""
        directory = self.machine_dir(machine_id)
        self._reap()
        try:
            pid_text, start = (directory / _PID_FILE).read_text().split()
            pid = int(pid_text)
        except (OSError, ValueError):
            return None
        if _proc_start_time(pid) != start:
            return None
        if not _is_slirp_for(pid, directory / _NETNS_FILE):
            return None
        return pid

    def _reap(self) -> None:
        for pid, proc in list(self._children.items()):
            if proc.poll() is not None:
                del self._children[pid]

    async def _stop_slirp(self, pid: int) -> None:
        """SIGTERM, then SIGKILL after a second; through a pidfd, so never a reused pid."""
        try:
            pidfd = os.pidfd_open(pid)
        except ProcessLookupError:
            self._reap()
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
        proc = self._children.pop(pid, None)
        if proc is not None:
            proc.wait()

    def _log_tail(self, directory: Path) -> str:
        try:
            text = (directory / _LOG_FILE).read_text(errors="replace").strip()
        except OSError:
            return "(no log)"
        return " | ".join(text.splitlines()[-3:]) or "(empty log)"

    async def _adopt(self, machine_id: str) -> NetworkHandle | None:
        directory = self.machine_dir(machine_id)
        path = directory / _NETNS_FILE
        if not _is_nsfs_mount(path):
            return None
        pid = self._recorded_slirp(machine_id)
        if not self.enabled:
            for stray in {pid, *_find_slirps(path)} - {None}:
                assert stray is not None
                await self._stop_slirp(stray)
            (directory / _PID_FILE).unlink(missing_ok=True)
            return self._handle(machine_id, None)
        try:
            await self._apply_rules(path)
            if pid is None:
                # Died (or never recorded): stop any unrecorded one, start afresh.
                for stray in _find_slirps(path):
                    await self._stop_slirp(stray)
                pid = await self._start_slirp(machine_id)
        except (OSError, NetworkError) as exc:
            raise NetworkError(f"cannot adopt the network of {machine_id}: {exc}") from exc
        return self._handle(machine_id, pid)

    async def _teardown(self, machine_id: str) -> None:
        directory = self.machine_dir(machine_id)
        path = directory / _NETNS_FILE
        pids = set(_find_slirps(path))
        recorded = self._recorded_slirp(machine_id)
        if recorded is not None:
            pids.add(recorded)
        await asyncio.gather(*(self._stop_slirp(pid) for pid in pids))
        try:
            _umount_all(path)
        except OSError as exc:
            raise NetworkError(f"cannot unmount {path}: {exc}") from exc
        for name in (_NETNS_FILE, _PID_FILE, f".{_PID_FILE}.tmp", _LOG_FILE):
            (directory / name).unlink(missing_ok=True)
        with contextlib.suppress(FileNotFoundError, OSError):
            directory.rmdir()  # kept if the driver stored its own files here

    def _probe_namespace(self, *, rules: bool) -> None:
        """Make a throwaway namespace (no mount) and load the rules in it."""
        batch = build_ruleset(*host_addresses(), self.extra_blocked) if rules else None
        failure: list[BaseException] = []

        def probe() -> None:
            try:
                _unshare_net()
                _lo_up()
                if batch is not None:
                    _Nft.run(batch)
            except BaseException as exc:
                failure.append(exc)

        thread = threading.Thread(target=probe, name="podbay-netns-probe", daemon=True)
        thread.start()
        thread.join()
        if failure:
            exc = failure[0]
            if isinstance(exc, OSError):
                raise exc
            raise OSError(errno.EIO, str(exc))


def _resolver_problems(resolv_conf: Path, slirp_sandbox: bool) -> list[str]:
    """Why slirp4netns's DNS forwarder (10.0.2.3) would not work on this host.

    It forwards to the first IPv4 ``nameserver`` of the host's resolv.conf, which
    ``--enable-sandbox`` reads from a mount namespace holding only /etc and /run.
    """
    problems = []
    real = Path(os.path.realpath(resolv_conf))
    if slirp_sandbox and not (real.is_relative_to("/etc") or real.is_relative_to("/run")):
        problems.append(
            f"network: {resolv_conf} points to {real}, which slirp4netns's sandbox cannot "
            "see (only /etc and /run): make it a regular file or a link into /run"
        )
    try:
        text = resolv_conf.read_text()
    except OSError as exc:
        return [*problems, f"network: cannot read {resolv_conf} ({exc.strerror}): "
                "sandbox DNS needs the host's resolver configuration"]  # fmt: skip
    servers = [line.split()[1] for line in text.splitlines()
               if line.startswith("nameserver") and len(line.split()) > 1]  # fmt: skip
    if not any(_is_ipv4(server) for server in servers):
        problems.append(
            f"network: {resolv_conf} names no IPv4 nameserver, so sandbox DNS (10.0.2.3) "
            "has nowhere to go: add one (nameserver <address>)"
        )
    return problems


def _is_ipv4(text: str) -> bool:
    try:
        return isinstance(ipaddress.ip_address(text), ipaddress.IPv4Address)
    except ValueError:
        return False


def _slirp_version(binary: str) -> tuple[int, int] | None:
    try:
        out = subprocess.run(
            [binary, "--version"], capture_output=True, text=True, timeout=5, check=False
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.search(r"slirp4netns version (\d+)\.(\d+)", out)
    return (int(match.group(1)), int(match.group(2))) if match else None
