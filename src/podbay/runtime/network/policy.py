"""The egress policy every sandbox class gets, as an nftables ruleset (pure: no I/O).

A sandbox's packets leave through a host-owned network namespace. Inside it::

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

A sandbox's own egress policy (:class:`~podbay.domain.egress.EgressPolicy`)
narrows this further, after the refusals above (which it can never lift):
``deny_v4`` refused, then with ``internet: false`` everything (DNS to slirp
too), or with an allow list everything but ``allow_v4``. IPv6 entries need no
rule: no IPv6 leaves the namespace at all. Domain entries get ``resolved_v4``,
which podbay's resolver fills with what it answered (:mod:`.resolver`), and
under any policy that is not open port 53 anywhere else is refused. Such a
policy also gets ``ip podbay_names`` (:func:`names_redirect_batch`), which
sends the namespace's new TCP connections to the name check (:mod:`.namecheck`),
and refuses UDP port 443 (QUIC, whose name that check cannot read).

The same policy serves a runc container, gVisor's netstack and a QEMU guest:
packets from the namespace's kernel stack pass ``inet podbay``'s output hook;
frames a user-space stack writes to ``tap0`` directly (gVisor) pass
``netdev podbay_tap``'s egress hook on that device.

The operator's budgets (:class:`Budgets`, the same for every sandbox) sit in
both tables too, in a chain of their own after the policy's, so they hold
whatever the policy and survive its swaps: new connections beyond a rate are
refused (``inet``: a TCP reset or ICMP error; ``netdev``: dropped). The
bandwidth cap is no nftables rule but a token bucket qdisc on ``tap0``
(:func:`shaping_argv`), which every class's packets pass on their way to
slirp4netns: a policer that drops lets TCP overshoot its rate (docs/network.md,
"Budgets").
"""

from __future__ import annotations

import hashlib
import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass

from ...domain.egress import OPEN, EgressPolicy, networks
from ...errors import NetworkError

__all__ = [
    "BLOCKED_IPV4",
    "BLOCKED_IPV6",
    "CHECK_MARK",
    "DISABLED_RESOLV_CONF",
    "MTU",
    "NAMES_TABLE",
    "NO_BUDGETS",
    "RESOLV_CONF",
    "SANDBOX_ADDRESS",
    "SLIRP_DNS",
    "SLIRP_GATEWAY",
    "TABLE",
    "TAP_NAME",
    "Budgets",
    "budgets",
    "build_ruleset",
    "build_tap_ruleset",
    "names_redirect_batch",
    "resolved_batch",
    "shaping_argv",
    "slirp_names_redirect_batch",
    "slirp_names_table",
]

#: slirp4netns's fixed layout (its default ``--cidr=10.0.2.0/24``).
SANDBOX_ADDRESS = "10.0.2.100"
SLIRP_GATEWAY = "10.0.2.2"
SLIRP_DNS = "10.0.2.3"
TAP_NAME = "tap0"
MTU = 65520
TABLE = "podbay"

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


#: What IPv4 protocols leave a sandbox whose policy is not open (every other is
#: refused, ICMP echo included).
POLICY_PROTOCOLS: tuple[str, ...] = ("tcp", "udp")
#: Ports of a resolver (DNS 53; DNS over TLS, and over QUIC, 853), refused to
#: every address under a policy that is not open: the sandbox's own resolver
#: is the only one it asks.
RESOLVER_PORTS: tuple[int, ...] = (53, 853)

#: Bounds of ``runtime.egress_bandwidth_mbit`` (0: no cap): 1 Mbit/s to 100 Gbit/s.
MAX_BANDWIDTH_MBIT = 100_000
#: Bounds of ``runtime.egress_new_connections_per_second`` (0: no cap).
MAX_NEW_CONNECTIONS_PER_SECOND = 100_000
#: Marks what the namespace's kernel stack sent (it passed ``inet podbay``'s
#: budget already), so ``tap0``'s hook counts only what a user-space stack wrote.
KERNEL_MARK = 0x706F6462
#: The name check's own connections onward (``SO_MARK``; a sandbox cannot set
#: a mark): the redirect lets them by, the policy's rules still hold them.
CHECK_MARK = 0x706F6463
#: ``ip podbay_names``: the table that sends a sandbox's TCP connections to its
#: name check (:mod:`.namecheck`), apart from ``inet podbay`` so that neither's
#: swap touches the other.
NAMES_TABLE = f"{TABLE}_names"


@dataclass(frozen=True)
class Budgets:
    """What one sandbox may use of the host's network, whatever its policy
    (the operator's settings; 0: no cap)."""

    #: Outgoing bandwidth in Mbit/s (10^6 bits), every connection together.
    bandwidth_mbit: int = 0
    #: New outgoing connections (TCP connections, UDP flows) per second.
    new_connections_per_second: int = 0

    @property
    def connection_burst(self) -> int:
        """New connections allowed at once beyond the rate: a tenth of a
        second's worth, at least 5 (a client opening a few in parallel)."""
        return max(5, self.new_connections_per_second // 10)

    @property
    def bandwidth_burst_bytes(self) -> int:
        """The token bucket's depth: 20 ms at the rate, at least two of tap0's
        largest packets (GSO makes them up to 64 KiB; a packet larger than the
        bucket would never leave)."""
        return max(2 * (MTU + 1024), self.bandwidth_mbit * 1_000_000 // 8 // 50)


NO_BUDGETS = Budgets()


def budgets(bandwidth_mbit: int, new_connections_per_second: int) -> Budgets:
    """The budgets of ``runtime.egress_bandwidth_mbit`` and
    ``runtime.egress_new_connections_per_second``, refused out of range."""
    for name, value, top in (
        ("runtime.egress_bandwidth_mbit", bandwidth_mbit, MAX_BANDWIDTH_MBIT),
        (
            "runtime.egress_new_connections_per_second",
            new_connections_per_second,
            MAX_NEW_CONNECTIONS_PER_SECOND,
        ),
    ):
        if not 0 <= value <= top:
            raise NetworkError(f"{name} must be 0 (no cap) or 1 to {top}, not {value}")
    return Budgets(bandwidth_mbit, new_connections_per_second)


def shaping_argv(budgets: Budgets) -> list[str]:
    """The ``tc`` command (run inside the sandbox's namespace once ``tap0``
    exists) that puts the bandwidth cap on ``tap0``.

    A token bucket queues what is over the rate instead of dropping it: the
    sender's TCP (the namespace's, gVisor's, or QEMU's guest's behind libslirp)
    is held back by its own socket buffer and stays at the rate."""
    if not budgets.bandwidth_mbit:
        raise ValueError("no bandwidth cap to put on tap0")
    return [
        "tc", "qdisc", "replace", "dev", TAP_NAME, "root", "tbf",
        "rate", f"{budgets.bandwidth_mbit}mbit",
        "burst", str(budgets.bandwidth_burst_bytes),
        "latency", "50ms",
    ]  # fmt: skip


def _connection_limit(budgets: Budgets) -> str:
    """A named limit, so that one bucket counts every kind of new connection."""
    if not budgets.new_connections_per_second:
        return ""
    return (
        f"\tlimit new_connections {{\n\t\trate over {budgets.new_connections_per_second}"
        f"/second burst {budgets.connection_burst} packets\n\t}}\n"
    )


def _inet_budget(budgets: Budgets) -> str:
    """After the policy's output chain (what it refused never gets here): a new
    connection over the rate is refused as the policy refuses, at once. The
    name check's connection onward (:data:`CHECK_MARK`) is the sandbox's own,
    counted already on its way to the check: it is let by.

    A connection's first packet only: conntrack calls every packet of a flow
    ``new`` until an answer comes back (a one-way UDP stream never has one),
    but its entry is confirmed once that first packet has left."""
    if not budgets.new_connections_per_second:
        return ""
    first = "ct state new ct status & confirmed == 0"
    over = 'limit name "new_connections" counter'
    return f"""\
\tchain budget {{
\t\ttype filter hook output priority filter + 10; policy accept;
\t\toifname "lo" accept
\t\tmeta mark {CHECK_MARK:#x} accept comment "checked"
\t\tmeta mark set {KERNEL_MARK:#x}
\t\t{first} meta l4proto tcp {over} reject with tcp reset comment "connection-rate"
\t\t{first} meta l4proto != tcp {over} reject with icmpx type admin-prohibited \
comment "flow-rate"
\t}}
"""


def _tap_budget(budgets: Budgets) -> str:
    """The same cap on what a user-space stack (gVisor's) writes to ``tap0``,
    with no connection tracking at this hook: a TCP connection is its first
    SYN, a UDP flow (address, ports) is new when not seen for a minute."""
    if not budgets.new_connections_per_second:
        return ""
    flow = "ip daddr . udp sport . udp dport"
    over = 'limit name "new_connections" counter drop comment'
    return f"""\
\tset udp_flows {{
\t\ttype ipv4_addr . inet_service . inet_service
\t\tflags dynamic,timeout
\t\ttimeout 60s
\t\tsize 65536
\t}}
\tchain budget {{
\t\ttype filter hook egress device "{TAP_NAME}" priority filter + 10; policy accept;
\t\tmeta mark {{ {KERNEL_MARK:#x}, {CHECK_MARK:#x} }} accept
\t\tip protocol udp {flow} @udp_flows update @udp_flows {{ {flow} }} accept
\t\ttcp flags & (syn | ack) == syn {over} "connection-rate"
\t\tip protocol udp {over} "flow-rate"
\t\tip protocol udp update @udp_flows {{ {flow} }}
\t}}
"""


def _elements(
    host_v4: Iterable[ipaddress.IPv4Network | str],
    host_v6: Iterable[ipaddress.IPv6Network | str],
    extra_blocked: Iterable[str],
) -> tuple[str, str]:
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
    return (
        ", ".join(str(n) for n in ipaddress.collapse_addresses(v4)),
        ", ".join(str(n) for n in ipaddress.collapse_addresses(v6)),
    )


def _set(name: str, kind: str, elements: str) -> str:
    # An empty set takes no elements line ("elements = { }" is a syntax error).
    listed = f"\t\telements = {{ {elements} }}\n" if elements else ""
    return f"""\
\tset {name} {{
\t\ttype {kind}
\t\tflags interval
{listed}\t}}
"""


def _v4(entries: Iterable[str]) -> str:
    nets = [n for n in networks(entries) if isinstance(n, ipaddress.IPv4Network)]
    return ", ".join(str(n) for n in ipaddress.collapse_addresses(nets))


def _egress_sets(egress: EgressPolicy) -> str:
    """The policy's own sets (IPv4 only: no IPv6 leaves the namespace), and for
    a policy with names, what podbay's resolver answered (:mod:`.resolver`)."""
    sets = _set("deny_v4", "ipv4_addr", _v4(egress.deny)) + _set(
        "allow_v4", "ipv4_addr", _v4(egress.allow)
    )
    if egress.has_names:
        sets += "\tset resolved_v4 {\n\t\ttype ipv4_addr\n\t\tflags timeout\n\t}\n"
    return sets


def resolved_batch(records: Iterable[tuple[str, int]], *, tap: bool) -> str:
    """Adds resolved ``(address, seconds)`` to the ``resolved_v4`` set of both
    tables (``inet`` only while there is no ``tap0``)."""
    listed = ", ".join(f"{address} timeout {seconds}s" for address, seconds in records)
    if not listed:
        return ""
    batch = f"add element inet {TABLE} resolved_v4 {{ {listed} }}\n"
    if tap:
        batch += f"add element netdev {TABLE}_tap resolved_v4 {{ {listed} }}\n"
    return batch


def names_redirect_batch(port: int | None, *, replace: bool) -> str:
    """The batch that sends every new TCP connection off ``lo`` to the name
    check listening on ``127.0.0.1:port`` (None: none, the table goes).

    The kernel runs every nat chain at its own hook priority (-100 for output),
    after ``inet podbay``'s output chain under such a policy (``filter - 150``):
    the policy judges the connection's real destination first and only what
    it let through is checked; the check's own connection onward carries
    :data:`CHECK_MARK` and is not redirected again, but meets the policy again.
    """
    batch = _swap("ip", NAMES_TABLE, replace)
    if port is None:
        return batch
    return f"""\
{batch}table ip {NAMES_TABLE} {{
\tchain output {{
\t\ttype nat hook output priority -100; policy accept;
\t\toifname "lo" return
\t\tmeta mark {CHECK_MARK:#x} return
\t\tmeta l4proto tcp counter redirect to :{port} comment "name-check"
\t}}
}}
"""


def slirp_names_table(machine_id: str) -> str:
    """The host's nat table that redirects one gVisor sandbox's slirp4netns
    (a name of its own per machine: tables are swapped and dropped alone)."""
    digest = hashlib.sha256(machine_id.encode()).hexdigest()[:16]
    return f"{NAMES_TABLE}_slirp_{digest}"


def slirp_names_redirect_batch(
    table: str, socket_match: str | None, check: tuple[str, int] | None, *, replace: bool
) -> str:
    """The batch, for the *host's* namespace, that sends every new TCP
    connection of one slirp4netns (its sockets matched by ``socket_match``,
    their cgroup: :mod:`.slirpgroup`) to the name check listening on
    ``check``, an address of the host's loopback and a port (None: none, the
    table goes).

    gVisor's frames met the policy at ``tap0`` before slirp4netns made its
    socket, so what reaches this hook was let through already. Loopback
    destinations are left alone: they are slirp's forwarder asking podbay's
    resolver over TCP (``--disable-host-loopback`` and the tap rules keep the
    sandbox's own connections from any). The check's connection onward is
    the node process's, outside the group: not redirected again.
    """
    batch = _swap("ip", table, replace)
    if check is None or socket_match is None:
        return batch
    address, port = check
    return f"""\
{batch}table ip {table} {{
\tchain output {{
\t\ttype nat hook output priority -100; policy accept;
\t\t{socket_match} ip daddr != 127.0.0.0/8 meta l4proto tcp \\
\t\t\tcounter dnat to {address}:{port} comment "name-check"
\t}}
}}
"""


def _dns(egress: EgressPolicy, indent: str = "\t\t", *, podbay_dns: bool = False) -> str:
    """slirp's DNS forwarder answers every name: under a default-deny policy it
    would be a tunnel out, and under a policy naming domains a way round
    podbay's resolver.

    With ``podbay_dns`` the forwarder asks podbay's resolver for this sandbox
    (:mod:`.slirpdns`), which answers what the policy allows, over UDP and TCP:
    its lookups pass whenever a name may be resolved. Port 53 only: libslirp
    sends any port of 10.0.2.3 on to that host-loopback address."""
    if podbay_dns:
        if egress.default_deny and not egress.has_names:
            return ""  # no name is the policy's to answer
        return (
            f'{indent}ip daddr {SLIRP_DNS} udp dport 53 counter accept comment "dns-podbay"\n'
            f'{indent}ip daddr {SLIRP_DNS} tcp dport 53 counter accept comment "dns-podbay"\n'
        )
    if egress.default_deny or egress.has_names:
        return ""
    return (
        f'{indent}ip daddr {SLIRP_DNS} udp dport 53 counter accept comment "dns-udp"\n'
        f'{indent}ip daddr {SLIRP_DNS} tcp dport 53 counter accept comment "dns-tcp"\n'
    )


def _egress_rules(egress: EgressPolicy, ipv4: str, refusals: tuple[str, ...]) -> str:
    """The policy's rules after the platform's refusals: ``ipv4`` matches any IPv4
    packet at the hook; each of ``refusals`` is a verdict that follows a match, in
    order (one ``counter drop`` at the netdev hook, where ``reject`` does not exist)."""

    def refuse(match: str, comment: str, verdicts: tuple[str, ...] = refusals) -> str:
        return "".join(f'\t\t{match} {verdict} comment "{comment}"\n' for verdict in verdicts)

    lines = refuse("ip daddr @deny_v4", "denied")
    if not egress.open:
        # Only TCP and UDP leave under a policy: ICMP echo (ping tunnels), GRE,
        # SCTP, UDP-Lite... would carry data the policy's rules (ports, the
        # resolver's answers) never look at, even to an allowed address.
        # (No TCP among them: the last verdict, an ICMP error or a drop.)
        others = f"ip protocol != {{ {', '.join(POLICY_PROTOCOLS)} }}"
        lines += refuse(others, "not-tcp-udp", refusals[-1:])
        # A sandbox's lookups go to its own resolver (slirp's, or podbay's on lo,
        # both accepted before this): one elsewhere, even on an allowed address,
        # would answer names the policy refuses. 853 is DNS over TLS (TCP) and
        # over QUIC (UDP); DNS over HTTPS is HTTPS, refused only where its
        # address is (an allow list that does not name it, a deny list that does).
        ports = ", ".join(str(p) for p in RESOLVER_PORTS)
        lines += refuse(f"ip protocol {{ tcp, udp }} th dport {{ {ports} }}", "other-resolver")
    if egress.has_names:
        # QUIC (HTTP/3) carries its name in packets the name check never sees:
        # refused, clients fall back to TCP, where it is checked.
        lines += refuse("udp dport 443", "quic")
        lines += '\t\tip daddr @resolved_v4 counter accept comment "resolved"\n'
    if egress.default_deny:
        lines += '\t\tip daddr @allow_v4 counter accept comment "allowed"\n'
        lines += refuse(ipv4, "not-allowed")
    return lines


#: The policy's refusal in ``inet``'s output chain, like "blocked": a TCP reset,
#: otherwise an ICMP error, so a client fails at once instead of timing out.
_REJECT_V4 = (
    "meta l4proto tcp counter reject with tcp reset",
    "counter reject with icmp type admin-prohibited",
)


def _swap(family: str, table: str, replace: bool) -> str:
    """With ``replace``: the lines that make, then drop, an earlier ``table``
    (so the batch's own create never meets it)."""
    return f"table {family} {table}\ndelete table {family} {table}\n" if replace else ""


# build_ruleset and build_tap_ruleset take the same parameters on purpose: they
# are one policy at two hooks, and the manager builds both from one set of inputs.
def build_ruleset(
    host_v4: Iterable[ipaddress.IPv4Network | str] = (),
    host_v6: Iterable[ipaddress.IPv6Network | str] = (),
    extra_blocked: Iterable[str] = (),
    egress: EgressPolicy = OPEN,
    *,
    replace: bool = False,
    budgets: Budgets = NO_BUDGETS,
) -> str:
    """The nftables batch loaded inside a sandbox's namespace, as one atomic transaction.

    ``inet podbay`` filters what the namespace's own kernel stack sends: a runc
    sandbox's sockets, or a process's (QEMU's user networking) started inside.

    With ``replace`` it first swaps out an earlier ``inet podbay`` table (create,
    delete, create in one batch), which refreshes the host addresses of a running
    sandbox with no moment unfiltered. Deleting a table makes the kernel wait for
    an RCU grace period, so a fresh namespace loads it without.
    """
    e4, e6 = _elements(host_v4, host_v6, extra_blocked)
    sets = _set("blocked_v4", "ipv4_addr", e4) + _set("blocked_v6", "ipv6_addr", e6)
    sets += _egress_sets(egress)
    dns = _dns(egress)
    # Under a policy with names the name check's redirect (a nat chain, which
    # the kernel runs at its own priority, -100) follows: this chain runs first,
    # so it judges a connection's real destination, not the check's address.
    priority = "filter - 150" if egress.has_names else "filter"
    return f"""\
{_swap("inet", TABLE, replace)}table inet {TABLE} {{
{_connection_limit(budgets)}{sets}\tchain output {{
\t\ttype filter hook output priority {priority}; policy drop;
\t\toifname "lo" accept
{dns}\t\tip daddr @blocked_v4 meta l4proto tcp counter reject with tcp reset comment "blocked"
\t\tip daddr @blocked_v4 counter reject with icmp type admin-prohibited comment "blocked"
\t\tip6 daddr @blocked_v6 meta l4proto tcp counter reject with tcp reset comment "blocked"
\t\tip6 daddr @blocked_v6 counter reject with icmpv6 type admin-prohibited comment "blocked"
\t\tmeta nfproto ipv6 meta l4proto tcp counter reject with tcp reset comment "ipv6-off"
\t\tmeta nfproto ipv6 counter reject with icmpv6 type admin-prohibited comment "ipv6-off"
{_egress_rules(egress, "meta nfproto ipv4", _REJECT_V4)}\t\tmeta nfproto ipv4 accept
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
{_inet_budget(budgets)}}}
"""


def build_tap_ruleset(
    host_v4: Iterable[ipaddress.IPv4Network | str] = (),
    host_v6: Iterable[ipaddress.IPv6Network | str] = (),
    extra_blocked: Iterable[str] = (),
    egress: EgressPolicy = OPEN,
    *,
    replace: bool = False,
    budgets: Budgets = NO_BUDGETS,
    podbay_dns: bool = False,
) -> str:
    """The same policy at ``tap0``'s egress hook: ``netdev podbay_tap`` (the
    same parameters as :func:`build_ruleset` on purpose: one policy; and
    ``podbay_dns`` when slirp4netns's DNS forwarder asks podbay's resolver,
    :mod:`.slirpdns`).

    A sandbox with a network stack of its own (gVisor's netstack) sends through
    a packet socket on ``tap0``, which no ``inet`` hook sees; every frame still
    passes the device's egress hook on its way to slirp4netns. ``reject`` does
    not exist there, so blocked packets are dropped (a connection attempt times
    out instead of failing at once). Load it once ``tap0`` exists.
    """
    e4, _ = _elements(host_v4, host_v6, extra_blocked)
    name = f"{TABLE}_tap"
    # No IPv6 set: every IPv6 frame is dropped ("other").
    sets = _connection_limit(budgets) + _set("blocked_v4", "ipv4_addr", e4) + _egress_sets(egress)
    return f"""\
{_swap("netdev", name, replace)}table netdev {name} {{
{sets}\tchain egress {{
\t\ttype filter hook egress device "{TAP_NAME}" priority filter; policy drop;
\t\tether type arp accept
{_dns(egress, podbay_dns=podbay_dns)}\t\tip daddr @blocked_v4 counter drop comment "blocked"
{_egress_rules(egress, "ether type ip", ("counter drop",))}\t\tether type ip accept
\t\tcounter drop comment "other"
\t}}
{_tap_budget(budgets)}}}
"""
