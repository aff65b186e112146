"""Facts about the host the policy and ``podbay doctor`` need.

:func:`host_addresses` reads the calling thread's namespace from ``/proc``
(no subprocess); :func:`problems` says, one remedy per line, what stops
sandbox networking on this host.
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import os
import shutil
from collections.abc import Sequence
from pathlib import Path

from . import netns, nft, slirp, slirpdns
from .policy import build_ruleset

__all__ = ["host_addresses", "problems", "resolver_problems"]


def host_addresses() -> tuple[list[ipaddress.IPv4Network], list[ipaddress.IPv6Network]]:
    """Every address the calling thread's network namespace has, on any interface.

    IPv4 from the kernel's local routes in ``fib_trie`` (``host LOCAL`` entries,
    which include whole local prefixes such as 127.0.0.0/8), IPv6 from ``if_inet6``.
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


def problems(
    *, enabled: bool, extra_blocked: Sequence[str], slirp_binary: str, slirp_sandbox: bool
) -> list[str]:
    """Problems that stop networking here, each with a one-line remedy."""
    found: list[str] = []
    if os.geteuid() != 0:
        return [
            "network: not running as root; per-sandbox network namespaces need "
            "CAP_SYS_ADMIN and CAP_NET_ADMIN: run the node as root"
        ]
    try:
        _probe_namespace(build_ruleset(*host_addresses(), extra_blocked) if enabled else None)
    except OSError as exc:
        if "nft" in str(exc):
            found.append(
                f"network: the kernel refused the sandbox firewall ({exc}); "
                "enable nf_tables with reject and conntrack (modprobe nf_tables "
                "nft_reject_inet nft_ct) or use a kernel that has them"
            )
        else:
            found.append(
                f"network: cannot create a network namespace ({exc}); run as root "
                "on a kernel with CONFIG_NET_NS"
            )
    if not enabled:
        return found
    if not nft.available():
        found.append("network: nftables missing: apt-get install nftables")
    binary = shutil.which(slirp_binary)
    if binary is None:
        found.append("network: slirp4netns missing: apt-get install slirp4netns")
    else:
        version = slirp.version(binary)
        if version is None or version < (1, 1):
            found.append(
                f"network: slirp4netns {version or 'of unknown version'} is too old "
                "(need >= 1.1): install slirp4netns from Debian 12 or newer"
            )
    if not os.path.exists("/dev/net/tun"):
        found.append("network: /dev/net/tun missing: modprobe tun")
    if _wildcard_dns_server():
        found.append(
            "network: a server holds port 53 on 0.0.0.0, so gVisor sandboxes get no "
            "address for podbay's resolver (127.112.0.0/12): under a policy that "
            "names domains no name resolves for them; bind that server to its own "
            "addresses (dnsmasq: --bind-interfaces)"
        )
    return found + resolver_problems(Path("/etc/resolv.conf"), slirp_sandbox)


def _wildcard_dns_server() -> bool:
    for table, tcp in (("/proc/net/udp", False), ("/proc/net/tcp", True)):
        try:
            text = Path(table).read_text()
        except OSError:
            continue
        if slirpdns.wildcard_port_53(text, tcp=tcp):
            return True
    return False


def _probe_namespace(batch: str | None) -> None:
    """Make a throwaway namespace (no mount) and load the rules in it."""

    def probe() -> None:
        netns.unshare()
        netns.lo_up()
        if batch is not None:
            nft.load(batch)

    try:
        netns.run_in_thread_now(probe)
    except OSError:
        raise
    except Exception as exc:
        raise OSError(errno.EIO, str(exc)) from exc


def resolver_problems(resolv_conf: Path, slirp_sandbox: bool) -> list[str]:
    """Why slirp4netns's DNS forwarder (10.0.2.3) would not work on this host.

    It forwards to the first IPv4 ``nameserver`` of the host's resolv.conf, which
    ``--enable-sandbox`` reads from a mount namespace holding only /etc and /run.
    """
    found = []
    real = Path(os.path.realpath(resolv_conf))
    if slirp_sandbox and not (real.is_relative_to("/etc") or real.is_relative_to("/run")):
        found.append(
            f"network: {resolv_conf} points to {real}, which slirp4netns's sandbox cannot "
            "see (only /etc and /run): make it a regular file or a link into /run"
        )
    try:
        text = resolv_conf.read_text()
    except OSError as exc:
        return [*found, f"network: cannot read {resolv_conf} ({exc.strerror}): "
                "sandbox DNS needs the host's resolver configuration"]  # fmt: skip
    servers = [line.split()[1] for line in text.splitlines()
               if line.startswith("nameserver") and len(line.split()) > 1]  # fmt: skip
    if not any(_is_ipv4(server) for server in servers):
        found.append(
            f"network: {resolv_conf} names no IPv4 nameserver, so sandbox DNS (10.0.2.3) "
            "has nowhere to go: add one (nameserver <address>)"
        )
    return found


def _is_ipv4(text: str) -> bool:
    try:
        return isinstance(ipaddress.ip_address(text), ipaddress.IPv4Address)
    except ValueError:
        return False
