"""The egress probes' decoy, without root: where it goes and what it counts."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest

from podbay.runtime.network import decoy
from podbay.runtime.network.decoy import COUNTED, Witness, free_subnet


def test_the_decoy_takes_the_first_free_documentation_subnet(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    taken = [ipaddress.IPv4Network("198.51.100.248/29"), ipaddress.IPv4Network("192.0.2.0/24")]
    monkeypatch.setattr(decoy, "_taken", lambda: taken)
    assert free_subnet() == ipaddress.IPv4Network("198.51.100.240/29")
    # A host whose own network is one of them (this test machine sits in 192.0.2.0/24).
    every = [ipaddress.IPv4Network(n) for n in ("198.51.100.0/24", "203.0.113.0/24")]
    monkeypatch.setattr(decoy, "_taken", lambda: [*every, taken[1]])
    with pytest.raises(RuntimeError, match="no free /29"):
        free_subnet()


def test_the_witness_counts_each_kind_and_each_address_https() -> None:
    rules = Witness(Path("/nonexistent"), ("198.51.100.250", "198.51.100.251")).ruleset()
    for name in [*COUNTED, "https_0", "https_1"]:
        assert f"counter seen_{name} {{ }}" in rules  # prefixed: "icmp" is an nft keyword
        assert f'counter name "seen_{name}"' in rules
    assert 'ip daddr 198.51.100.251 tcp dport 443 counter name "seen_https_1"' in rules
    # The host's own neighbour discovery is no sandbox's IPv6.
    assert "meta nfproto ipv6 meta l4proto { tcp, udp }" in rules
