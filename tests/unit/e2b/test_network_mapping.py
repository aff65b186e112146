"""E2B's network options as podbay's egress policy (podbay.e2b.network): E2B's
allow-wins rules translated into podbay's deny-wins ones, what E2B's detail
shows back, and every refusal a 400 (or 501) in E2B's shape, never a crash."""

from __future__ import annotations

import ipaddress
from typing import Any

import pytest

from podbay.domain.egress import MAX_ENTRIES, EgressPolicy
from podbay.e2b.network import ALL_TRAFFIC, e2b_view, policy_of, update_policy
from podbay.errors import E2BError


def doc(allow_internet_access: object = None, network: object = None) -> dict[str, Any] | None:
    policy = policy_of(allow_internet_access, network)
    return None if policy is None else policy.to_doc()


def test_nothing_named_leaves_the_deployments_default() -> None:
    assert doc() is None
    assert doc(True) is None
    assert doc(None, {}) is None
    # An allowOut with nothing denied is a no-op in E2B, so here too.
    assert doc(None, {"allowOut": ["1.1.1.1"]}) is None
    assert doc(None, {"allowPublicTraffic": False}) is None


def test_all_traffic_denied_is_no_internet_or_an_allow_list() -> None:
    assert doc(False) == {"internet": False}
    assert doc(None, {"denyOut": [ALL_TRAFFIC, "8.8.8.8"]}) == {"internet": False}
    allow = {"allowOut": ["1.1.1.1", "*.pypi.org"], "denyOut": [ALL_TRAFFIC]}
    assert doc(None, allow) == {"allow": ["1.1.1.1/32", "*.pypi.org"]}
    # allow_internet_access false is denyOut ALL_TRAFFIC: allowOut still wins.
    assert doc(False, {"allowOut": ["pypi.org"]}) == {"allow": ["pypi.org"]}


def test_dns_servers_are_opened_only_for_a_domain_rule() -> None:
    named = {"allowOut": ["pypi.org"], "denyOut": [ALL_TRAFFIC], "dnsServers": ["1.1.1.1"]}
    assert doc(None, named) == {"allow": ["pypi.org", "1.1.1.1/32"]}
    addressed = {"allowOut": ["9.9.9.9"], "denyOut": [ALL_TRAFFIC], "dnsServers": ["1.1.1.1"]}
    assert doc(None, addressed) == {"allow": ["9.9.9.9/32"]}


def test_allow_exceptions_are_cut_out_of_a_narrower_deny() -> None:
    assert doc(None, {"denyOut": ["8.8.8.8"]}) == {"deny": ["8.8.8.8/32"]}
    cut = doc(None, {"denyOut": ["10.9.0.0/30"], "allowOut": ["10.9.0.1"]})
    assert cut == {"deny": ["10.9.0.0/32", "10.9.0.2/31"]}
    # What is left denies exactly the denied addresses the allowed ones are not.
    left = [ipaddress.ip_network(n) for n in cut["deny"]]
    for last in range(4):
        address = ipaddress.ip_address(f"10.9.0.{last}")
        assert any(address in net for net in left) == (last != 1)
    # An exception covering the whole denied range leaves nothing denied.
    assert doc(None, {"denyOut": ["10.9.0.0/30"], "allowOut": ["10.9.0.0/29"]}) is None
    assert doc(None, {"denyOut": ["2001:db8::/127"], "allowOut": ["2001:db8::1"]}) == {
        "deny": ["2001:db8::/128"]
    }


def test_a_cut_that_outgrows_podbays_limit_is_refused() -> None:
    holes = [f"2001:db8:{i:x}::1" for i in range(1, 40)]  # ~80 CIDRs left per hole
    with pytest.raises(E2BError) as caught:
        policy_of(None, {"denyOut": ["2001:db8::/32"], "allowOut": holes})
    assert (caught.value.status, caught.value.code) == (400, "SANDBOX_NETWORK_TOO_LARGE")
    assert str(MAX_ENTRIES) in caught.value.message


@pytest.mark.parametrize(
    ("allow_internet_access", "network", "status", "code"),
    [
        ("no", None, 400, "SANDBOX_NETWORK_INVALID"),
        (None, [], 400, "SANDBOX_NETWORK_INVALID"),
        (None, {"denyOut": ["example.com"]}, 400, "SANDBOX_NETWORK_ENTRY_INVALID"),
        (None, {"allowOut": ["example.com"]}, 400, "SANDBOX_NETWORK_INVALID"),
        (
            None,
            {"allowOut": ["1.1.1.1:443"], "denyOut": [ALL_TRAFFIC]},
            400,
            "SANDBOX_NETWORK_ENTRY_INVALID",
        ),
        (None, {"denyOut": ["[2001:db8::1]:443"]}, 400, "SANDBOX_NETWORK_ENTRY_INVALID"),
        (None, {"denyOut": ["10.0.0.1/8"]}, 400, "SANDBOX_NETWORK_ENTRY_INVALID"),
        (None, {"denyOut": [7]}, 400, "SANDBOX_NETWORK_ENTRY_INVALID"),
        (None, {"denyOut": "8.8.8.8"}, 400, "SANDBOX_NETWORK_INVALID"),
        (None, {"denyOut": ["8.8.8.8"] * (MAX_ENTRIES + 1)}, 400, "SANDBOX_NETWORK_TOO_LARGE"),
        (None, {"dnsServers": ["::1"]}, 400, "SANDBOX_NETWORK_ENTRY_INVALID"),
        (None, {"dnsServers": ["1.1.1.1"] * 11}, 400, "SANDBOX_NETWORK_INVALID"),
        (None, {"allowPublicTraffic": "yes"}, 400, "SANDBOX_NETWORK_INVALID"),
        (None, {"denyOut": [], "somethingElse": 1}, 400, "SANDBOX_NETWORK_INVALID"),
        (None, {"rules": {"a.com": [{}]}}, 501, "E2B_NOT_IMPLEMENTED"),
        (None, {"egressProxy": {"address": "p:1080"}}, 501, "E2B_NOT_IMPLEMENTED"),
        (None, {"maskRequestHost": "${PORT}-x.example.com"}, 501, "E2B_NOT_IMPLEMENTED"),
        (None, {"httpsPorts": [3000]}, 501, "E2B_NOT_IMPLEMENTED"),
        (None, {"allowPublicTraffic": True}, 501, "E2B_NOT_IMPLEMENTED"),
    ],
)
def test_refusals(allow_internet_access: object, network: object, status: int, code: str) -> None:
    with pytest.raises(E2BError) as caught:
        policy_of(allow_internet_access, network)
    assert (caught.value.status, caught.value.code) == (status, code), caught.value.message


def test_an_update_replaces_every_field() -> None:
    assert update_policy({}) == EgressPolicy()
    assert update_policy({"allow_internet_access": False}) == EgressPolicy(internet=False)
    assert update_policy({"allowInternetAccess": False}) == EgressPolicy(internet=False)
    both = {"allowOut": ["1.1.1.1"], "denyOut": [ALL_TRAFFIC]}
    assert update_policy(both).to_doc() == {"allow": ["1.1.1.1/32"]}
    for bad, code in [
        ({"allow_internet_access": False, "allowInternetAccess": True}, "SANDBOX_NETWORK_INVALID"),
        ({"allowPublicTraffic": False}, "SANDBOX_NETWORK_INVALID"),
        ({"egressProxy": {"address": "p:1"}}, "E2B_NOT_IMPLEMENTED"),
    ]:
        with pytest.raises(E2BError) as caught:
            update_policy(bad)
        assert caught.value.code == code


def test_the_detail_shows_the_policy_in_e2bs_terms() -> None:
    def view(**policy: Any) -> tuple[bool, dict[str, list[str]] | None]:
        return e2b_view(EgressPolicy.parse(policy))

    assert view() == (True, None)
    assert view(internet=False) == (False, {"denyOut": [ALL_TRAFFIC]})
    assert view(allow=["1.1.1.1", "pypi.org"]) == (
        False,
        {"allowOut": ["1.1.1.1/32", "pypi.org"], "denyOut": [ALL_TRAFFIC]},
    )
    assert view(deny=["8.8.8.8"]) == (True, {"denyOut": ["8.8.8.8/32"]})
    # Set through podbay's own API, beyond what E2B's form can say.
    assert view(deny=["example.com"]) == (True, None)
    assert view(allow=["203.0.113.0/24"], deny=["203.0.113.7"]) == (False, None)


@pytest.mark.parametrize(
    "network",
    [
        {"allowOut": ["1.1.1.1", "*.pypi.org"], "denyOut": [ALL_TRAFFIC]},
        {"denyOut": ["8.8.8.0/24", "9.9.9.9"]},
        {"denyOut": [ALL_TRAFFIC]},
    ],
)
def test_what_the_detail_shows_creates_the_same_policy(network: dict[str, Any]) -> None:
    policy = policy_of(None, network)
    assert policy is not None
    internet, shown = e2b_view(policy)
    assert policy_of(internet, shown) == policy
