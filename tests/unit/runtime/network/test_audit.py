"""The egress audit's ruleset, the parsing of ``nft -j`` output and the join
with the resolver's names (pure; tests/integration/network/test_network_audit*.py
load and read them in real namespaces)."""

from __future__ import annotations

import json

from podbay.domain.egress import EgressDestination
from podbay.runtime.network.audit import (
    SIZE,
    TIMEOUT,
    Counted,
    NameBook,
    audit_ruleset,
    destinations,
    parse_sets,
)
from podbay.runtime.network.policy import CHECK_MARK, KERNEL_MARK


def _listing(sets: dict[str, list[tuple[str, object, int, int, int, float]]]) -> str:
    items: list[object] = [{"metainfo": {"version": "1.0.6"}}]
    for name, elements in sets.items():
        items.append(
            {
                "set": {
                    "family": "inet",
                    "name": name,
                    "table": "podbay_audit",
                    "elem": [
                        {
                            "elem": {
                                "val": {"concat": [a, proto, port]},
                                "expires": expires,
                                "counter": {"packets": packets, "bytes": size},
                            }
                        }
                        for a, proto, port, packets, size, expires in elements
                    ],
                }
            }
        )
    items.append({"chain": {"name": "attempted"}})
    return json.dumps({"nftables": items})


def test_the_audit_chains_sit_around_the_policy_and_carry_no_verdict() -> None:
    inet = audit_ruleset()
    assert "table inet podbay_audit" in inet
    assert "netdev" not in inet
    # Before the policy's chain, which runs at "filter - 150" under names.
    assert "hook output priority filter - 175" in inet
    assert "hook output priority filter + 20" in inet
    assert f"size {SIZE}" in inet
    assert f"timeout {TIMEOUT}s" in inet
    # Marked before the policy, so tap0's chains skip the kernel stack's packets;
    # the name check's own connection keeps its mark (the redirect reads it)
    # and is not counted (the sandbox's connection to the check is, by its
    # original destination), nor is what the sandbox answers.
    assert f"meta mark set {KERNEL_MARK:#x}" in inet
    assert inet.index(f"meta mark {CHECK_MARK:#x} accept") < inet.index("meta mark set")
    assert "ct direction reply accept" in inet
    assert (
        "update @reached_v4 { ct original ip daddr . meta l4proto . ct original proto-dst }" in inet
    )
    assert 'oifname "lo" ct status & dnat == 0 accept' in inet
    # Loaded again (adoption) it keeps its sets and its rules once.
    assert "flush chain inet podbay_audit attempted" in inet
    assert "delete" not in inet
    for line in inet.splitlines():
        if "update @" in line:
            # A full set makes "update" stop the rule: a verdict after it would
            # then be skipped. The audit's rules have none.
            assert not line.rstrip().endswith(("accept", "drop", "reset", "prohibited")), line
    tap = audit_ruleset(inet=False, tap=True)
    assert "table netdev podbay_audit_tap" in tap
    assert 'hook egress device "tap0" priority filter - 175' in tap
    assert f"meta mark {{ {KERNEL_MARK:#x}, {CHECK_MARK:#x} }} accept" in tap
    assert "table inet" not in tap
    # No ports outside TCP and UDP: an ICMP "port" would be its checksum.
    assert "meta l4proto != { tcp, udp } update @reached_v4 { ip daddr . meta l4proto . 0 }" in tap


def test_the_listing_is_parsed_and_what_is_not_an_element_is_skipped() -> None:
    text = _listing(
        {
            "attempted_v4": [
                ("203.0.113.5", "tcp", 443, 10, 1000, 3500),
                ("203.0.113.6", 47, 0, 1, 60, 3000),  # a protocol nft has no name for
            ],
            "reached_v4": [("203.0.113.5", "tcp", 443, 9, 900, 3590.5)],
        }
    )
    doc = json.loads(text)
    doc["nftables"][1]["set"]["elem"] += [
        {"elem": {"val": "not a concat", "counter": {"packets": 1, "bytes": 1}}},
        {"elem": {"val": {"concat": ["1.2.3.4", "tcp", True]}, "counter": {}}},
        {"elem": {"val": {"concat": ["1.2.3.4", "tcp", 1]}}},  # no counter
        "junk",
    ]
    sets = parse_sets(json.dumps(doc))
    assert sets["attempted_v4"] == {
        ("203.0.113.5", "tcp", 443): Counted(10, 1000, 3500.0),
        ("203.0.113.6", "47", 0): Counted(1, 60, 3000.0),
    }
    assert sets["reached_v4"] == {("203.0.113.5", "tcp", 443): Counted(9, 900, 3590.5)}
    assert parse_sets("") == {}


def test_refused_is_what_was_attempted_and_not_reached_summed_over_both_hooks() -> None:
    inet = {
        "attempted_v4": {
            ("203.0.113.5", "tcp", 443): Counted(10, 1000, 3500),
            ("198.51.100.9", "tcp", 22): Counted(2, 120, 3000),
        },
        "reached_v4": {("203.0.113.5", "tcp", 443): Counted(9, 940, 3590)},
    }
    tap = {
        "attempted_v4": {("203.0.113.5", "tcp", 443): Counted(5, 500, 3599)},
        "reached_v4": {
            ("203.0.113.5", "tcp", 443): Counted(5, 500, 3599),
            # Reached but not attempted: the attempted set was full.
            (
                "203.0.113.7",
                "udp",
                53,
            ): Counted(1, 70, 3000),
        },
    }
    now = 1_700_000_000.0
    rows = destinations([inet, tap], {"203.0.113.5": "pypi.org"}, now)
    # Busiest first; last seen: the latest packet either set saw, to the second.
    assert rows == [
        EgressDestination("203.0.113.5", 443, "tcp", "pypi.org", "reached", 14, 1440, now - 1),
        EgressDestination("198.51.100.9", 22, "tcp", None, "refused", 2, 120, now - 600),
        EgressDestination("203.0.113.7", 53, "udp", None, "reached", 1, 70, now - 600),
        EgressDestination("203.0.113.5", 443, "tcp", "pypi.org", "refused", 1, 60, now - 1),
    ]
    assert destinations([], {}, now) == []


def test_names_are_bounded_and_only_plain_host_names() -> None:
    book = NameBook(limit=3)
    book.answered("pypi.org", ["203.0.113.1", "203.0.113.2"])
    book.answered("files.pythonhosted.org", ["203.0.113.2"])  # the latest answer names it
    for bad in ("bad name", "evil\x1b[31m.org", "a" * 64 + ".org", "x." * 127 + "x", "", "-a.org"):
        book.answered(bad, ["203.0.113.9"])
    assert book.names() == {"203.0.113.1": "pypi.org", "203.0.113.2": "files.pythonhosted.org"}
    book.answered("a.test", ["203.0.113.3"])
    book.answered("b.test", ["203.0.113.4"])  # the least recently answered goes
    assert book.names() == {
        "203.0.113.2": "files.pythonhosted.org",
        "203.0.113.3": "a.test",
        "203.0.113.4": "b.test",
    }
    book.clear()
    assert book.names() == {}
