"""The egress-hook copy of the policy, for stacks that bypass the inet hooks."""

from __future__ import annotations

from podbay.runtime.network.policy import TAP_NAME, build_ruleset, build_tap_ruleset


def _elements(ruleset: str) -> str:
    start = ruleset.index("set blocked_v4")
    return ruleset[ruleset.index("elements", start) : ruleset.index("}", start)]


def test_same_destinations_as_the_inet_table() -> None:
    args = (["198.51.100.7/32"], ["2001:db8::5/128"], ["203.0.113.0/25"])
    assert _elements(build_tap_ruleset(*args)) == _elements(build_ruleset(*args))


def test_egress_hook_on_tap_drops_all_but_arp_dns_and_allowed_ipv4() -> None:
    rules = build_tap_ruleset()
    chain = rules[rules.index("chain egress") :]
    assert f'hook egress device "{TAP_NAME}"' in chain
    assert "policy drop" in chain
    assert chain.index("ether type arp accept") < chain.index("@blocked_v4")
    assert chain.index("dport 53") < chain.index("@blocked_v4 counter drop")
    assert chain.index("@blocked_v4 counter drop") < chain.index("ether type ip accept")
    assert "reject" not in chain  # the egress hook has no reject
    assert build_tap_ruleset(replace=True).startswith(
        "table netdev podbay_tap\ndelete table netdev podbay_tap\n"
    )
