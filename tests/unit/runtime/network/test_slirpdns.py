"""Where a gVisor sandbox's slirp4netns sends its lookups: podbay's resolver
on a host-loopback address of that sandbox's (no root, no namespaces)."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest

from podbay.domain.egress import OPEN, EgressPolicy
from podbay.runtime.network import slirpdns
from podbay.runtime.network.policy import SLIRP_DNS, build_ruleset, build_tap_ruleset
from podbay.runtime.network.slirp import Slirps


def test_candidates_are_stable_distinct_and_in_the_range() -> None:
    first = slirpdns.candidates("m-1")
    assert first == slirpdns.candidates("m-1")  # an adoption finds the same ones
    assert len(set(first)) == len(first) == 16
    assert first[0] != slirpdns.candidates("m-2")[0]
    for address in first:
        parsed = ipaddress.IPv4Address(address)
        assert parsed in slirpdns.ADDRESSES
        assert parsed not in ipaddress.IPv4Network("127.0.0.0/16")  # the host's services
        assert parsed.packed[3] not in (0, 255)


def test_choose_skips_what_other_machines_hold() -> None:
    first = slirpdns.candidates("m-1")
    assert slirpdns.choose("m-1", [first[0], "127.0.0.53"]) == first[1:]


def test_the_file_names_the_address_and_nothing_else_is_read_back() -> None:
    address = slirpdns.candidates("m-1")[0]
    text = slirpdns.resolv_conf(address)
    assert f"\nnameserver {address}\n" in text
    assert slirpdns.address_in(text) == address
    # Only an address of the range podbay writes: never one a stray file names.
    assert slirpdns.address_in("nameserver 127.0.0.53\n") is None
    assert slirpdns.address_in("nameserver 8.8.8.8\n") is None
    assert slirpdns.address_in("nameserver nonsense\n") is None
    assert slirpdns.address_in("") is None
    with pytest.raises(ValueError, match="octets"):
        slirpdns.resolv_conf("not an address")


def _tap_dns(egress: EgressPolicy) -> list[str]:
    rules = build_tap_ruleset(egress=egress, podbay_dns=True)
    chain = rules[rules.index("chain egress") :]
    return [line.strip() for line in chain.splitlines() if f"ip daddr {SLIRP_DNS}" in line]


def test_the_tap_hook_passes_lookups_to_podbays_resolver_when_a_name_may_resolve() -> None:
    port_53 = [
        f'ip daddr {SLIRP_DNS} {proto} dport 53 counter accept comment "dns-podbay"'
        for proto in ("udp", "tcp")
    ]
    names = EgressPolicy.parse({"allow": ["pypi.org", "*.pypi.org"]})
    for egress in (OPEN, names, EgressPolicy.parse({"deny": ["evil.test"]})):
        # Port 53 only: libslirp sends any port of 10.0.2.3 on to the
        # host-loopback address, where only podbay's resolver is to answer.
        assert _tap_dns(egress) == port_53
    # No name is the policy's to answer: slirp's forwarder stays closed.
    for egress in (
        EgressPolicy.parse({"internet": False}),
        EgressPolicy.parse({"allow": ["192.0.2.0/24"]}),
    ):
        assert _tap_dns(egress) == []
    # Before it, the blocks (10.0.0.0/8 holds 10.0.2.3); the inet table (runc, a
    # vm's QEMU) is what it was: their lookups meet the resolver on lo.
    rules = build_tap_ruleset(egress=names, podbay_dns=True)
    assert rules.index("dns-podbay") < rules.index("@blocked_v4 counter drop")
    assert "@resolved_v4" in rules
    assert "dns-" not in build_ruleset(egress=names)
    assert "dns-" not in build_tap_ruleset(egress=names)


def test_slirp4netns_sees_the_file_in_a_mount_namespace_of_its_own() -> None:
    netns, resolv = Path("/run/x/netns"), Path("/run/x/slirp.resolv.conf")
    argv = Slirps("slirp4netns").argv(netns, 7, resolv)
    assert argv[:5] == ["unshare", "--mount", "--propagation", "private", "--"]
    assert argv[5:7] == ["sh", "-c"]
    assert argv[8] == str(resolv)  # $0: never interpolated into the script
    assert argv[9] == "slirp4netns"
    assert argv[-2:] == [str(netns), "tap0"]
    assert "--enable-sandbox" in argv
    assert "--disable-host-loopback" in argv
    assert "--enable-sandbox" not in Slirps("slirp4netns", sandbox=False).argv(netns, 7, resolv)
    assert "sh" not in Slirps("slirp4netns").argv(netns, 7)  # every other sandbox: as before


UDP_TABLE = """\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid
 1: 3500007F:0035 00000000:0000 07 00000000:00000000 00:00000000 00000000   101
 2: 00000000:0044 00000000:0000 07 00000000:00000000 00:00000000 00000000     0
"""


def test_doctor_sees_a_dns_server_on_the_wildcard_address() -> None:
    # systemd-resolved's 127.0.0.53 and a DHCP client's 0.0.0.0:68: no conflict.
    assert not slirpdns.wildcard_port_53(UDP_TABLE, tcp=False)
    wildcard = UDP_TABLE + " 3: 00000000:0035 00000000:0000 07 0 0 0 0\n"
    assert slirpdns.wildcard_port_53(wildcard, tcp=False)
    tcp = UDP_TABLE.replace("3500007F:0035", "00000000:0035")
    assert not slirpdns.wildcard_port_53(tcp.replace(" 07 ", " 01 ", 1), tcp=True)  # a connection
    assert slirpdns.wildcard_port_53(tcp.replace(" 07 ", " 0A ", 1), tcp=True)  # listening
