"""The ruleset text and host-address discovery: no root, no namespaces."""

from __future__ import annotations

import ipaddress
from pathlib import Path

from podbay.runtime.network.hostcheck import host_addresses, resolver_problems
from podbay.runtime.network.policy import BLOCKED_IPV4, BLOCKED_IPV6, build_ruleset


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
    assert "198.51.100.7" in v4 and "203.0.113.0/25" in v4
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
