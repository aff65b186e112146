"""The network of each machine: a host-owned namespace, its rules, its slirp4netns.

Every machine gets a network namespace that the *host* creates, in the host's
initial user namespace. The sandbox only joins it (a runc container through
``config.json``, runsc and QEMU by being started inside it with
:meth:`NetworkManager.enter_argv`), so it holds no capability over it: it
cannot change addresses, routes or the nftables rules loaded here, and it
cannot open raw or packet sockets that would bypass them.

Nothing here knows which isolation class uses the namespace: a driver asks for
a machine id's network, gets the nsfs path back, and puts its sandbox there.
Everything needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN in the initial user
namespace). See ``docs/network.md``.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import ipaddress
import logging
import shutil
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ...domain.egress import OPEN, EgressPolicy
from ...errors import NetworkError
from ..base import check_machine_id
from . import hostcheck, netns, nft, slirp, slirpdns
from .audit import TABLE as AUDIT_TABLE
from .audit import TAP_TABLE as AUDIT_TAP_TABLE
from .audit import Destination, NameBook, audit_ruleset, destinations, parse_sets
from .namecheck import NameCheck
from .policy import (
    DISABLED_RESOLV_CONF,
    NO_BUDGETS,
    RESOLV_CONF,
    Budgets,
    build_ruleset,
    build_tap_ruleset,
    names_redirect_batch,
    resolved_batch,
    shaping_argv,
    slirp_names_redirect_batch,
    slirp_names_table,
)
from .resolver import Resolver
from .slirpgroup import SlirpGroup
from .watch import AddressWatch

__all__ = ["NetworkHandle", "NetworkManager"]

log = logging.getLogger("podbay.runtime.network")

_NETNS_FILE = "netns"
#: The machine's egress policy (absent: open), read whenever its rules reload
#: (a refresh, an adoption after the node restarted), so they keep it.
_EGRESS_FILE = "egress.json"
#: Everything of a network in a machine's directory (slirp's log is opened
#: before slirp4netns starts, so a started one always left that).
_STATE_FILES = (
    _NETNS_FILE,
    slirp.PID_FILE,
    f".{slirp.PID_FILE}.tmp",
    slirp.LOG_FILE,
    _EGRESS_FILE,
    f".{_EGRESS_FILE}.tmp",
    slirpdns.RESOLV_FILE,
    f".{slirpdns.RESOLV_FILE}.tmp",
)


@dataclass(frozen=True, kw_only=True)
class NetworkHandle:
    """What a driver needs to put a sandbox on this network."""

    machine_id: str
    #: Bind-mounted nsfs file: an OCI config's network namespace ``path``, or
    #: what ``nsenter --net=`` enters to start a process (runsc, QEMU) inside.
    netns_path: Path
    #: slirp4netns process id; ``None`` when networking is disabled.
    slirp_pid: int | None
    #: Content for the sandbox's ``/etc/resolv.conf``.
    resolv_conf: str
    #: Outbound internet (slirp + rules) rather than loopback only.
    enabled: bool


class NetworkManager:
    """Creates, adopts and removes the network of each machine under ``run_dir``.

    ``run_dir/<machine_id>/`` holds ``netns`` (the nsfs bind mount), ``slirp.pid``
    (``"<pid> <start time>"``) and ``slirp.log``. With ``enabled=False`` a machine
    gets a namespace with only ``lo``: no slirp, no route anywhere.

    ``extra_blocked`` adds destinations (CIDRs) no sandbox may reach, e.g. a
    control plane or database on a public address elsewhere.

    ``budgets`` caps every machine's outgoing bandwidth and new connections
    (the operator's settings, :func:`.policy.budgets`), whatever its policy.
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
        slirp_limits: slirp.SlirpLimits | None = None,
        dns_upstream: str | None = None,
        budgets: Budgets = NO_BUDGETS,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.enabled = enabled
        self.extra_blocked = tuple(extra_blocked)
        self.budgets = budgets
        if budgets.bandwidth_mbit and enabled and shutil.which("tc") is None:
            # Refused at start, not at the first sandbox's.
            raise NetworkError("runtime.egress_bandwidth_mbit needs tc (apt-get install iproute2)")
        for item in self.extra_blocked:
            ipaddress.ip_network(item, strict=False)  # fail early on a typo
        self.slirps = slirp.Slirps(
            slirp_binary, sandbox=slirp_sandbox, ready_timeout=ready_timeout, limits=slirp_limits
        )
        self._locks: dict[str, asyncio.Lock] = {}
        self._watch: AddressWatch | None = None
        #: Where podbay's resolvers ask (None: the host's first IPv4 nameserver).
        self.dns_upstream = dns_upstream
        #: Per machine whose policy names domains: the resolver serving it.
        self._resolvers: dict[str, Resolver] = {}
        #: Per machine: which name the resolver gave which address (the audit's
        #: names; in memory: a node restart forgets them).
        self._names: dict[str, NameBook] = {}
        #: Per machine whose policy names domains: its connections' name check.
        self._checks: dict[str, NameCheck] = {}

    # -- paths

    def machine_dir(self, machine_id: str) -> Path:
        return self.run_dir / check_machine_id(machine_id)

    def netns_path(self, machine_id: str) -> Path:
        """Where the machine's namespace is (or will be) mounted."""
        return self.machine_dir(machine_id) / _NETNS_FILE

    def enter_argv(self, machine_id: str) -> list[str]:
        """A command prefix that starts a process inside the machine's namespace."""
        return netns.enter_argv(self.netns_path(machine_id))

    def machines(self) -> list[str]:
        """Machine ids with network state under ``run_dir`` (for garbage collection)."""
        try:
            entries = [e for e in self.run_dir.iterdir() if e.is_dir() and not e.is_symlink()]
        except FileNotFoundError:
            return []
        return sorted(
            e.name
            for e in entries
            if any((e / name).exists() for name in (_NETNS_FILE, slirp.PID_FILE))
        )

    # -- public API

    async def setup(
        self,
        machine_id: str,
        *,
        netns_source: Path | None = None,
        filtered: asyncio.Event | None = None,
        tapped: asyncio.Event | None = None,
        egress: EgressPolicy = OPEN,
        own_stack: bool = False,
    ) -> NetworkHandle:
        """Create the machine's namespace, load its rules, start slirp4netns.

        ``egress``: the sandbox's own policy, in its rules from the first packet
        on (an adopted network keeps the one it has: :meth:`set_egress` changes it).

        ``netns_source``: a namespace made elsewhere (a ``/proc/PID/ns/net``) to
        use instead of a new one (the OCI driver's comes with the sandbox's own
        user namespace, which must own it).

        ``filtered`` is set as soon as :meth:`netns_path` holds the namespace with
        the ``inet`` policy loaded, while slirp4netns still brings ``tap0`` up: a
        sandbox whose own kernel stack sends (runc) may be started in it from then
        on, as long as no command runs in it before this returns.

        ``tapped`` is set once ``tap0`` is up with both tables loaded, while
        slirp4netns's budget (:class:`~.slirp.SlirpLimits`) may still be being
        applied: a sandbox whose netstack takes ``tap0`` over (runsc) may start
        from then on, under the same condition. (A cgroup move costs the start
        an RCU grace period.)

        ``own_stack``: the sandbox writes to ``tap0`` with a network stack of its
        own (gVisor's netstack), so its lookups reach slirp4netns's forwarder
        rather than the namespace's ``lo``: that forwarder is pointed at a
        resolver podbay serves for it from now on, whatever the policy
        (:mod:`.slirpdns`), so that domain rules hold for it too.

        Idempotent: a complete network that already exists is adopted and
        returned; a partial one is removed and built again. On failure nothing is
        left behind and :class:`NetworkError` is raised.
        """
        async with self._lock(machine_id):
            existing = await self._adopt(machine_id)
            if existing is not None:
                for event in (filtered, tapped):
                    if event is not None:
                        event.set()
                return existing
            if self._leftovers(machine_id):
                # Leftovers of a failed attempt. The directory itself stays: the
                # driver may have made it (with the mode its sandbox needs to
                # traverse) and be filling it at this moment; made again here, it
                # would get this module's 0700 and the sandbox could not reach
                # its root filesystem.
                await self._teardown(machine_id, keep_directory=True)
            try:
                self._write_egress(machine_id, egress)
                resolv_conf = None
                if own_stack and self.enabled:
                    # Listening before slirp4netns may forward its first lookup.
                    resolv_conf = await self._slirp_dns_or_none(machine_id, egress)
                pid = await self._create(machine_id, netns_source, filtered, tapped, resolv_conf)
                await self._serve_names(machine_id, egress, fresh=True)
            except BaseException as exc:
                try:
                    await asyncio.shield(self._teardown(machine_id))
                except Exception:
                    # The create's own failure is the one raised below; this one
                    # (what it may have left behind) is logged.
                    log.exception("network of %s: teardown after a failed create", machine_id)
                if isinstance(exc, NetworkError | asyncio.CancelledError):
                    raise
                if isinstance(exc, Exception):
                    raise NetworkError(f"network setup for {machine_id} failed: {exc}") from exc
                raise
            return self._handle(machine_id, pid)

    async def teardown(self, machine_id: str) -> None:
        """Stop slirp4netns, unmount and remove the namespace file and the directory.

        Idempotent; call it after the sandbox is gone (a process still inside
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

    def active(self, machine_id: str) -> bool:
        """Whether the machine's namespace exists (its rules are in force)."""
        return netns.is_mounted(self.netns_path(machine_id))

    def egress(self, machine_id: str) -> EgressPolicy:
        """The machine's egress policy (open when it never got one)."""
        try:
            text = (self.machine_dir(machine_id) / _EGRESS_FILE).read_text()
        except FileNotFoundError:
            return OPEN
        return EgressPolicy.from_json(text)

    async def audit(self, machine_id: str) -> list[Destination]:
        """The destinations the machine reached or was refused lately (see
        :mod:`.audit`); none while it has no network (stopped, suspended with its
        network gone, or loopback only)."""
        path = self.netns_path(machine_id)
        if not self.enabled or not netns.is_mounted(path):
            return []

        def enter_and_list() -> list[str]:
            netns.enter(path)
            listed = []
            for family, table in (("inet", AUDIT_TABLE), ("netdev", AUDIT_TAP_TABLE)):
                try:
                    listed.append(nft.query(f"list table {family} {table}"))
                except OSError:
                    # Not there (yet): no tap0, or set up before the audit existed.
                    continue
            return listed

        try:
            texts = await netns.in_fresh_thread(enter_and_list)
        except OSError:
            return []  # torn down meanwhile (a stop): no namespace, no audit
        book = self._names.get(machine_id)
        names = book.names() if book is not None else {}
        return destinations([parse_sets(t) for t in texts], names, time.time())

    async def set_egress(self, machine_id: str, egress: EgressPolicy) -> None:
        """Put ``egress`` in force for a running machine: its rules are swapped in
        one transaction (no packet sees none), and kept by later reloads."""
        async with self._lock(machine_id):
            path = self.netns_path(machine_id)
            if not netns.is_mounted(path):
                raise NetworkError(f"{machine_id} has no network namespace")
            before = self.egress(machine_id)
            self._write_egress(machine_id, egress)
            resolver = self._resolvers.get(machine_id)
            if resolver is not None:
                # What the old policy let it resolve is not the new one's to keep;
                # and from now on it answers by the new one (before the rules
                # swap: an answer the old one allowed must not land in the new
                # set; one the new allows landing in the old set is lost with it).
                resolver.answered.clear()
                resolver.policy = egress
            if not self.enabled:
                return  # loopback only: nothing leaves whatever the policy says
            try:
                await self._apply_rules(machine_id, tap=self._has_tap(machine_id))
            except BaseException:
                self._write_egress(machine_id, before)
                if resolver is not None:
                    resolver.policy = before
                raise
            await self._serve_names(machine_id, egress)

    async def _serve_names(
        self, machine_id: str, egress: EgressPolicy, *, fresh: bool = False
    ) -> None:
        """Start, update or stop the machine's resolver and name check for
        ``egress`` (``fresh``: a namespace just made, with no redirect yet)."""
        address = self._slirp_dns(machine_id)
        if not await self._serve_resolver(machine_id, egress, address):
            # Its address is held: another live process serves this machine's
            # names (its node, beside `podbay gc` or a second driver adopting
            # to look): the resolver and the name check stay that process's.
            log.info("network of %s: its names are served by another process", machine_id)
            return
        # A sandbox with its own network stack (gVisor, the one with that
        # address) sends frames the namespace's nat hook never sees: its TCP is
        # checked where it leaves as slirp4netns's sockets, on the host.
        await self._check_names(machine_id, egress, fresh=fresh, on_host=address is not None)

    async def _serve_resolver(
        self, machine_id: str, egress: EgressPolicy, address: str | None
    ) -> bool:
        """Start, update or stop the machine's resolver; ``False`` when its
        address is held by another process (``EADDRINUSE``)."""
        resolver = self._resolvers.get(machine_id)
        # slirp4netns's forwarder asks a gVisor sandbox's whatever the policy.
        wanted = self.enabled and (address is not None or egress.has_names)
        if not wanted:
            if resolver is not None:
                del self._resolvers[machine_id]
                await resolver.close()
            return True
        if resolver is not None:
            resolver.policy = egress
            return True
        resolver = self._resolver(machine_id, egress, host_address=address)
        try:
            await resolver.start()
        except NetworkError as exc:
            cause = exc.__cause__
            if isinstance(cause, OSError) and cause.errno == errno.EADDRINUSE:
                return False
            raise
        self._resolvers[machine_id] = resolver
        return True

    def _resolver(
        self, machine_id: str, egress: EgressPolicy, *, host_address: str | None = None
    ) -> Resolver:
        path = self.netns_path(machine_id)

        async def allow(records: list[tuple[str, int]]) -> None:
            # Both tables once tap0 is there (gVisor's frames meet the netdev one).
            await self._load(path, resolved_batch(records, tap=self._has_tap(machine_id)))

        book = self._names.setdefault(machine_id, NameBook())
        return Resolver(
            path,
            egress,
            (self._upstream(), 53),
            allow,
            named=book.answered,
            host_address=host_address,
        )

    def _slirp_dns(self, machine_id: str) -> str | None:
        """The host-loopback address the machine's slirp4netns sends its lookups
        to (``None``: it asks the host's resolver, the sandbox has none of its own)."""
        try:
            text = (self.run_dir / machine_id / slirpdns.RESOLV_FILE).read_text()
        except FileNotFoundError:
            return None  # also one torn down meanwhile
        return slirpdns.address_in(text)

    async def _slirp_dns_or_none(self, machine_id: str, egress: EgressPolicy) -> Path | None:
        """:meth:`_serve_slirp_dns`, or ``None`` when the host leaves it no
        address (a DNS server listening on ``0.0.0.0:53``): the sandbox still
        starts, its lookups go to slirp's own forwarder as before, and under a
        policy that names domains the tap rules refuse that forwarder, so its
        names stay closed rather than open (``check_host`` says why)."""
        try:
            return await self._serve_slirp_dns(machine_id, egress)
        except NetworkError as exc:
            log.warning("network of %s: domain rules closed for it: %s", machine_id, exc)
            return None

    async def _serve_slirp_dns(self, machine_id: str, egress: EgressPolicy) -> Path:
        """Start the machine's resolver on a host-loopback address no other
        machine holds, and write the file slirp4netns will see as its
        ``/etc/resolv.conf`` (:mod:`.slirpdns`)."""
        # Every machine directory's, also one still being set up or whose
        # resolver is down until the node adopts it again.
        taken = [
            a
            for file in self.run_dir.glob(f"*/{slirpdns.RESOLV_FILE}")
            if file.parent.name != machine_id and (a := self._slirp_dns(file.parent.name))
        ]
        self.machine_dir(machine_id).mkdir(parents=True, exist_ok=True, mode=0o700)
        failures: list[str] = []
        for address in slirpdns.choose(machine_id, taken):
            resolver = self._resolver(machine_id, egress, host_address=address)
            try:
                await resolver.start()
            except NetworkError as exc:
                failures.append(str(exc.__cause__ or exc))
                continue  # held by something else on the host: the next one
            self._resolvers[machine_id] = resolver
            target = self.machine_dir(machine_id) / slirpdns.RESOLV_FILE
            temporary = target.with_name(f".{slirpdns.RESOLV_FILE}.tmp")
            temporary.write_text(slirpdns.resolv_conf(address))
            temporary.replace(target)
            return target
        raise NetworkError(
            f"no address on the host's loopback for {machine_id}'s resolver "
            f"(is a DNS server bound to 0.0.0.0:53?): {'; '.join(failures[-2:])}"
        )

    async def _check_names(
        self, machine_id: str, egress: EgressPolicy, *, fresh: bool, on_host: bool = False
    ) -> None:
        """Start, update or stop the machine's name check (:mod:`.namecheck`);
        in force (the redirect loaded) on return. ``on_host``: a gVisor
        sandbox's, redirected from its slirp4netns's sockets in the host's
        namespace (:func:`.policy.slirp_names_redirect_batch`)."""
        check = self._checks.get(machine_id)
        path = self.netns_path(machine_id)
        group = self._slirp_group(machine_id) if on_host else None
        if on_host and group is None and egress.has_names:
            log.warning(
                "network of %s: no cgroup v2 hierarchy on this host: its TLS SNI and "
                "HTTP Host go unchecked (its lookups still follow the policy)",
                machine_id,
            )
        if not self.enabled or not egress.has_names or (on_host and group is None):
            if check is not None:
                del self._checks[machine_id]
                # The redirect goes first: without its check it would refuse
                # every connection.
                if on_host:
                    await self._load_host(self._host_redirect(machine_id, None, None))
                elif netns.is_mounted(path):
                    await self._load(path, names_redirect_batch(None, replace=True))
                await check.close()
            return
        if check is not None:
            check.policy = egress
            return
        address = self._slirp_dns(machine_id) if on_host else None
        if address is not None:
            check = NameCheck(None, egress, machine_id, address)
        else:
            check = NameCheck(path, egress, machine_id)
        await check.start()
        try:
            # An adopted namespace may hold a redirect to a check that died with
            # the last node process: it is swapped for this one's.
            if group is not None and address is not None:
                batch = self._host_redirect(machine_id, group, (address, check.port))
                await self._load_host(batch)
            else:
                await self._load(path, names_redirect_batch(check.port, replace=not fresh))
        except BaseException:
            await check.close()
            raise
        self._checks[machine_id] = check

    def _slirp_group(self, machine_id: str) -> SlirpGroup | None:
        """The v2 cgroup a gVisor sandbox's slirp4netns is in (:mod:`.slirpgroup`)."""
        limits = self.slirps.limits
        return SlirpGroup.of(limits.cgroup_parent if limits else None, machine_id)

    @staticmethod
    def _host_redirect(
        machine_id: str, group: SlirpGroup | None, check: tuple[str, int] | None
    ) -> str:
        match = group.match() if group is not None else None
        return slirp_names_redirect_batch(slirp_names_table(machine_id), match, check, replace=True)

    @staticmethod
    async def _load_host(rules: str) -> None:
        """Load ``rules`` in the host's namespace (the node's own)."""
        await asyncio.to_thread(nft.load, rules)

    def _upstream(self) -> str:
        if self.dns_upstream is not None:
            return self.dns_upstream
        for line in Path("/etc/resolv.conf").read_text().splitlines():
            fields = line.split()
            if len(fields) >= 2 and fields[0] == "nameserver" and "." in fields[1]:
                return fields[1]
        raise NetworkError("no IPv4 nameserver in /etc/resolv.conf for podbay's resolver")

    def _write_egress(self, machine_id: str, egress: EgressPolicy) -> None:
        target = self.machine_dir(machine_id) / _EGRESS_FILE
        if egress.open:
            target.unlink(missing_ok=True)
            return
        target.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        temporary = target.with_name(f".{_EGRESS_FILE}.tmp")
        temporary.write_text(egress.to_json())
        temporary.replace(target)

    async def refresh(self, machine_id: str) -> None:
        """Reload the machine's rules, e.g. after the host gained an address."""
        path = self.netns_path(machine_id)
        if not netns.is_mounted(path):
            raise NetworkError(f"{machine_id} has no network namespace")
        if self.enabled:
            await self._apply_rules(machine_id)

    def watch_addresses(self) -> None:
        """From now on, reload every machine's rules whenever the host's addresses
        change (a warm machine must not reach an address the host gained after
        it started). Idempotent; :meth:`close` stops it."""
        if self.enabled and self._watch is None:
            self._watch = AddressWatch(self.refresh_all)
            self._watch.start()

    async def refresh_all(self) -> None:
        """Reload the rules of every machine with a network (each under its lock,
        so one being set up gets the new addresses once it is complete)."""
        for machine_id in self.machines():
            async with self._lock(machine_id):
                if netns.is_mounted(self.netns_path(machine_id)):
                    try:
                        await self._apply_rules(machine_id, tap=self._has_tap(machine_id))
                    except OSError as exc:
                        log.warning("machine %s: reloading its rules failed: %s", machine_id, exc)

    def _has_tap(self, machine_id: str) -> bool:
        return (
            self.slirps.recorded(self.machine_dir(machine_id), self.netns_path(machine_id))
            is not None
        )

    def resolv_conf(self) -> str:
        """``/etc/resolv.conf`` content for this manager's sandboxes."""
        return RESOLV_CONF if self.enabled else DISABLED_RESOLV_CONF

    def check_host(self) -> list[str]:
        """Problems that stop networking here, each with a one-line remedy (for doctor)."""
        return hostcheck.problems(
            enabled=self.enabled,
            extra_blocked=self.extra_blocked,
            slirp_binary=self.slirps.binary,
            slirp_sandbox=self.slirps.sandbox,
        )

    async def close(self) -> None:
        """Forget child processes without stopping them (slirps outlive the node).
        The resolvers and name checks stop: a sandbox's lookups fail, and its
        redirected TCP connections are refused, until :meth:`adopt` (or a new
        process's) serves them again, never reaching slirp's forwarder or
        leaving unchecked."""
        for machine_id in list(self._resolvers):
            await self._resolvers.pop(machine_id).close()
        for machine_id in list(self._checks):
            await self._checks.pop(machine_id).close()
        if self._watch is not None:
            await self._watch.close()
            self._watch = None
        self.slirps.forget()

    # -- internals

    def _lock(self, machine_id: str) -> asyncio.Lock:
        check_machine_id(machine_id)
        lock = self._locks.get(machine_id)
        if lock is None:
            lock = self._locks[machine_id] = asyncio.Lock()
        return lock

    def _handle(self, machine_id: str, pid: int | None) -> NetworkHandle:
        return NetworkHandle(
            machine_id=machine_id,
            netns_path=self.netns_path(machine_id),
            slirp_pid=pid,
            resolv_conf=self.resolv_conf(),
            enabled=self.enabled,
        )

    def _ruleset(
        self, machine_id: str, *, replace: bool = False, inet: bool = True, tap: bool = False
    ) -> str:
        v4, v6 = hostcheck.host_addresses()
        egress = self.egress(machine_id)
        podbay_dns = self._slirp_dns(machine_id) is not None
        return _rulesets(
            tuple(v4),
            tuple(v6),
            self.extra_blocked,
            egress,
            self.budgets,
            replace,
            inet,
            tap,
            podbay_dns,
        )

    async def _create(
        self,
        machine_id: str,
        source: Path | None = None,
        filtered: asyncio.Event | None = None,
        tapped: asyncio.Event | None = None,
        resolv_conf: Path | None = None,
    ) -> int | None:
        directory = self.machine_dir(machine_id)
        self.run_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        directory.mkdir(mode=0o700, exist_ok=True)
        path = directory / _NETNS_FILE
        rules = self._ruleset(machine_id) + audit_ruleset() if self.enabled else None
        loop = asyncio.get_running_loop()
        mounted: asyncio.Future[None] = loop.create_future()

        def settle() -> None:
            if not mounted.done():
                mounted.set_result(None)

        def build() -> None:
            # This thread becomes the namespace's first member, then exits.
            if source is None:
                netns.unshare()
                netns.bind_current(path)
            else:
                netns.bind(source, path)
                netns.enter(path)
            netns.lo_up()
            # tap0 gets no IPv6 (slirp's is off); lo keeps ::1. Set before slirp
            # may start (settle), or slirp's tap0 can beat it.
            with contextlib.suppress(FileNotFoundError):  # IPv6 off at boot
                netns.set_sysctl("net.ipv6.conf.default.disable_ipv6", "1")
            loop.call_soon_threadsafe(settle)
            if rules is not None:
                nft.load(rules)

        built = netns.in_fresh_thread(build)
        if filtered is not None:

            def mark_filtered(done: asyncio.Future[None]) -> None:
                if not done.cancelled() and done.exception() is None:
                    filtered.set()

            built.add_done_callback(mark_filtered)
        try:
            if not self.enabled:
                await built
                if tapped is not None:
                    tapped.set()  # no tap0: the namespace is all there is
                return None
            # slirp needs only the mounted file; the rules load meanwhile. Both are
            # done before setup returns, so no sandbox process ever runs unfiltered.
            await asyncio.wait({mounted, built}, return_when=asyncio.FIRST_COMPLETED)
            if built.done() and built.exception() is not None:
                await built  # raises
            up = asyncio.Event()
            # A gVisor sandbox's slirp4netns (the one given a resolv.conf) joins
            # the cgroup its name check's redirect matches before tap0 is up.
            group = self._slirp_group(machine_id) if resolv_conf is not None else None
            started = asyncio.ensure_future(
                self.slirps.start(directory, path, up=up, resolv_conf=resolv_conf, group=group)
            )
            try:
                await built
                await until_set(up, started)
                # tap0 exists now (slirp made it): its egress hook can be bound,
                # and its queue shaped.
                await self._load(
                    path,
                    self._ruleset(machine_id, inet=False, tap=True)
                    + audit_ruleset(inet=False, tap=True),
                )
                await self._shape(path)
            except BaseException:
                started.cancel()
                with contextlib.suppress(BaseException):
                    await started
                raise
            if tapped is not None:
                tapped.set()
            return await started
        except BaseException:
            # Cancelled or failed: let the thread finish before anyone cleans up,
            # or it could mount after the cleanup ran.
            with contextlib.suppress(BaseException):
                await asyncio.shield(built)
            raise

    async def _apply_rules(self, machine_id: str, *, tap: bool = True) -> None:
        """Reload the policy with the host's current addresses (both tables, or
        only ``inet`` while there is no ``tap0`` to bind to)."""
        rules = self._ruleset(machine_id, replace=True, tap=tap)
        resolver = self._resolvers.get(machine_id)
        if resolver is not None and self.egress(machine_id).has_names:
            # The swap empties resolved_v4: what was answered goes back in the
            # same transaction, so no allowed connection meets a moment without.
            rules += resolved_batch(resolver.live(), tap=tap)
        await self._load(self.netns_path(machine_id), rules)

    async def _shape(self, path: Path) -> None:
        """Put the bandwidth cap on ``tap0`` (with none, one that is there stays
        until the machine is set up again: a fresh tap0 has none)."""
        if not self.budgets.bandwidth_mbit:
            return
        argv = shaping_argv(self.budgets)

        def enter_and_shape() -> None:
            netns.enter(path)
            # A child forked from this thread starts in its namespace.
            done = subprocess.run(argv, capture_output=True, check=False, timeout=30)
            if done.returncode != 0:
                message = done.stderr.decode(errors="replace").strip()
                raise OSError(f"{' '.join(argv)}: {message}")

        await netns.in_fresh_thread(enter_and_shape)

    @staticmethod
    async def _load(path: Path, rules: str) -> None:
        def enter_and_load() -> None:
            netns.enter(path)
            nft.load(rules)

        await netns.in_fresh_thread(enter_and_load)

    async def _adopt(self, machine_id: str) -> NetworkHandle | None:
        directory = self.machine_dir(machine_id)
        path = directory / _NETNS_FILE
        if not netns.is_mounted(path):
            return None
        pid = self.slirps.recorded(directory, path)
        if not self.enabled:
            for stray in {pid, *slirp.find(path)} - {None}:
                assert stray is not None
                await self.slirps.stop(stray)
            (directory / slirp.PID_FILE).unlink(missing_ok=True)
            return self._handle(machine_id, None)
        try:
            if pid is None:
                await self._apply_rules(machine_id, tap=False)
                # Died (or never recorded): stop any unrecorded one, start afresh.
                for stray in slirp.find(path):
                    await self.slirps.stop(stray)
                resolv_conf = directory / slirpdns.RESOLV_FILE
                own_stack = resolv_conf.exists()
                pid = await self.slirps.start(
                    directory,
                    path,
                    resolv_conf=resolv_conf if own_stack else None,
                    group=self._slirp_group(machine_id) if own_stack else None,
                )
            # A new tap0 needs its cap and hook again; a live one gets fresh
            # addresses, and the cap the node now has.
            await self._shape(path)
            await self._apply_rules(machine_id)
            # Kept with its elements when there; made for a machine set up before
            # the audit existed; bound again to a new tap0.
            await self._load(path, audit_ruleset(inet=True, tap=True))
            await self._serve_names(machine_id, self.egress(machine_id))
        except (OSError, NetworkError) as exc:
            raise NetworkError(f"cannot adopt the network of {machine_id}: {exc}") from exc
        return self._handle(machine_id, pid)

    def _leftovers(self, machine_id: str) -> bool:
        """Whether an earlier attempt left network state in the machine's directory
        (a driver's own files there, or its making the directory, are none: a start
        has just torn down, so only a failed attempt in between leaves any)."""
        directory = self.machine_dir(machine_id)
        return any((directory / name).exists() for name in _STATE_FILES)

    async def _teardown(self, machine_id: str, *, keep_directory: bool = False) -> None:
        resolver = self._resolvers.pop(machine_id, None)
        if resolver is not None:
            await resolver.close()
        self._names.pop(machine_id, None)
        check = self._checks.pop(machine_id, None)
        if check is not None:
            await check.close()
        directory = self.machine_dir(machine_id)
        path = directory / _NETNS_FILE
        own_stack = (directory / slirpdns.RESOLV_FILE).exists()
        if own_stack:
            # Its slirp4netns's redirect on the host goes with it (also one a
            # dead node process left).
            try:
                await self._load_host(self._host_redirect(machine_id, None, None))
            except OSError as exc:
                message = f"cannot remove {machine_id}'s name-check redirect: {exc}"
                raise NetworkError(message) from exc
        pids: set[int] = set()
        if path.exists() or (directory / slirp.PID_FILE).exists():
            # A slirp4netns is only ever started for a namespace mounted here, and
            # both files stay until it is stopped (below): without them there is
            # none to look for, and a fresh machine's start (which tears down
            # twice) skips reading every process's command line.
            pids.update(slirp.find(path))
        recorded = self.slirps.recorded(directory, path)
        if recorded is not None:
            pids.add(recorded)
        await asyncio.gather(*(self.slirps.stop(pid) for pid in pids))
        self.slirps.remove_cgroup(machine_id)
        if own_stack and (group := self._slirp_group(machine_id)) is not None:
            group.remove()
        try:
            netns.unmount(path)
        except OSError as exc:
            raise NetworkError(f"cannot unmount {path}: {exc}") from exc
        for name in _STATE_FILES:
            (directory / name).unlink(missing_ok=True)
        if keep_directory:
            return
        with contextlib.suppress(OSError):
            directory.rmdir()  # kept if the driver stored its own files here


async def until_set(event: asyncio.Event, task: asyncio.Future[Any]) -> None:
    """Return once ``event`` is set (see :meth:`NetworkManager.setup`); raise what
    ``task`` failed with if it fails first."""
    waiter = asyncio.ensure_future(event.wait())
    try:
        await asyncio.wait({waiter, task}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()
    if task.done():
        task.result()


@functools.lru_cache(maxsize=16)
def _rulesets(
    v4: tuple[ipaddress.IPv4Network, ...],
    v6: tuple[ipaddress.IPv6Network, ...],
    extra_blocked: tuple[str, ...],
    egress: EgressPolicy,
    budgets: Budgets,
    replace: bool,
    inet: bool,
    tap: bool,
    podbay_dns: bool = False,
) -> str:
    """The batch for these host addresses: the same for every machine until the
    host's addresses change (merging the ranges costs each start a millisecond)."""
    args = (v4, v6, extra_blocked, egress)
    return (build_ruleset(*args, replace=replace, budgets=budgets) if inet else "") + (
        build_tap_ruleset(*args, replace=replace, budgets=budgets, podbay_dns=podbay_dns)
        if tap
        else ""
    )
