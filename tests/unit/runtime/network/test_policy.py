"""The ruleset text and host-address discovery: no root, no namespaces."""

from __future__ import annotations

import ipaddress
from pathlib import Path

from podbay.domain.egress import OPEN, EgressPolicy
from podbay.runtime.network.hostcheck import host_addresses, resolver_problems
from podbay.runtime.network.policy import (
    BLOCKED_IPV4,
    BLOCKED_IPV6,
    build_ruleset,
    build_tap_ruleset,
)


def _elements(ruleset: str, name: str) -> str:
    start = ruleset.index(f"set {name}")
    return ruleset[ruleset.index("elements", start) : ruleset.index("}", start)]


def test_required_ranges_are_blocked() -> None:
    required = [
        "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10",
        "169.254.0.0/16", "127.0.0.0/8", "0.0.0.0/8", "224.0.0.0/4", "240.0.0.0/4",
    ]  # fmt: skip
    nets = [ipaddress.ip_network(n) for n in BLOCKED_IPV4]
    for item in required:
        assert any(ipaddress.ip_network(item).subnet_of(n) for n in nets), item
    nets6 = [ipaddress.ip_network(n) for n in BLOCKED_IPV6]
    for item in ["::1/128", "fc00::/7", "fe80::/10", "ff00::/8", "::ffff:0:0/96"]:
        assert any(ipaddress.ip_network(item).subnet_of(n) for n in nets6), item


def test_host_addresses_are_merged_into_the_set() -> None:
    rules = build_ruleset(
        ["198.51.100.7/32", "10.1.2.3/32"], ["2001:db8::5/128"], ["203.0.113.0/25"]
    )
    v4 = _elements(rules, "blocked_v4")
    assert "198.51.100.7" in v4
    assert "203.0.113.0/25" in v4
    assert "10.1.2.3" not in v4  # inside 10/8 already: merged, no overlap for nft
    assert "2001:db8::5" in _elements(rules, "blocked_v6")


def test_dns_is_allowed_before_the_blocks() -> None:
    rules = build_ruleset()
    output = rules[rules.index("chain output") :]
    assert output.index('oifname "lo" accept') < output.index("dport 53")
    assert output.index("udp dport 53") < output.index("@blocked_v4")
    assert "policy drop" in output
    assert "delete table" not in rules
    assert build_ruleset(replace=True).startswith(
        "table inet podbay\ndelete table inet podbay\ntable inet podbay {"
    )


def test_host_addresses_include_loopback() -> None:
    v4, _ = host_addresses()
    assert any(ipaddress.ip_address("127.0.0.1") in n for n in v4)


def testresolver_problems(tmp_path: Path) -> None:
    good = tmp_path / "good"
    good.write_text("search lan\nnameserver 127.0.0.53\n")
    assert resolver_problems(good, slirp_sandbox=False) == []
    v6_only = tmp_path / "v6"
    v6_only.write_text("nameserver ::1\n")
    [problem] = resolver_problems(v6_only, slirp_sandbox=False)
    assert "no IPv4 nameserver" in problem
    # With slirp4netns's sandbox only /etc and /run are visible to it.
    [problem] = resolver_problems(good, slirp_sandbox=True)
    assert "make it a regular file or a link into /run" in problem


def test_an_open_policy_adds_no_rule() -> None:
    assert build_ruleset(egress=OPEN) == build_ruleset()
    assert "@allow_v4" not in build_ruleset()
    assert "not-allowed" not in build_ruleset()


def test_a_policy_comes_after_the_platform_refusals_at_both_hooks() -> None:
    egress = EgressPolicy.parse(
        {"allow": ["203.0.113.0/24", "2001:db8::/32", "pypi.org"], "deny": ["203.0.113.9"]}
    )
    for rules in (build_ruleset(egress=egress), build_tap_ruleset(egress=egress)):
        assert "203.0.113.0/24" in _elements(rules, "allow_v4")
        assert "203.0.113.9" in _elements(rules, "deny_v4")
        assert "2001:db8" not in rules
        assert "pypi" not in rules
        order = [rules.index(m) for m in ("@blocked_v4", "@deny_v4", "@allow_v4", "not-allowed")]
        assert order == sorted(order)
        assert "dns-udp" not in rules  # slirp's forwarder would answer any name
        assert "other-resolver" in rules
        assert "@resolved_v4" in rules


def test_no_internet_refuses_every_packet_but_loopback() -> None:
    rules = build_ruleset(egress=EgressPolicy.parse({"internet": False}))
    assert "dns-udp" not in rules
    assert "dns-tcp" not in rules
    assert "set allow_v4 {\n\t\ttype ipv4_addr\n\t\tflags interval\n\t}" in rules  # empty
    output = rules[rules.index("chain output") :]
    assert output.index("not-allowed") < output.index("meta nfproto ipv4 accept")


def test_a_deny_list_of_names_closes_slirps_forwarder_too() -> None:
    egress = EgressPolicy.parse({"deny": ["evil.org"]})
    for rules in (build_ruleset(egress=egress), build_tap_ruleset(egress=egress)):
        assert "dns-udp" not in rules
        assert "other-resolver" in rules
        assert "not-allowed" not in rules  # the rest stays open
    cidrs = EgressPolicy.parse({"deny": ["192.0.2.0/24"]})
    assert "dns-udp" in build_tap_ruleset(egress=cidrs)  # no names: slirp's lookups as before


def test_a_policy_that_is_not_open_lets_only_tcp_and_udp_leave() -> None:
    """ICMP echo (ping tunnels), GRE, SCTP... and DNS over TCP, UDP or TLS to
    any resolver but the sandbox's own are refused before an allowed address
    is accepted, at both hooks; an open policy leaves them to the platform."""
    for doc in ({"allow": ["203.0.113.9"]}, {"deny": ["192.0.2.0/24"]}, {"internet": False}):
        egress = EgressPolicy.parse(doc)
        for rules in (build_ruleset(egress=egress), build_tap_ruleset(egress=egress)):
            assert "ip protocol != { tcp, udp }" in rules, doc
            assert "th dport { 53, 853 }" in rules, doc
            allowed = rules.index("@allow_v4 counter accept") if "allow" in doc else len(rules)
            assert rules.index("not-tcp-udp") < allowed
            assert rules.index("other-resolver") < allowed
    for rules in (build_ruleset(), build_tap_ruleset()):
        assert "not-tcp-udp" not in rules
        assert "853" not in rules
