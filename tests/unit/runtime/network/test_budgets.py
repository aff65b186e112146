"""The operator's budgets: ``runtime.egress_bandwidth_mbit`` and
``runtime.egress_new_connections_per_second`` as settings, as nftables text
and as the ``tc`` command (the measurements: test_network_budgets.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from podbay.domain.egress import EgressPolicy
from podbay.runtime.base import DriverError
from podbay.runtime.network.policy import (
    CHECK_MARK,
    MAX_BANDWIDTH_MBIT,
    MAX_NEW_CONNECTIONS_PER_SECOND,
    MTU,
    NO_BUDGETS,
    Budgets,
    build_ruleset,
    build_tap_ruleset,
    shaping_argv,
)
from podbay.runtime.oci.driver import OciDriver
from podbay.runtime.vm.driver import VmDriver
from podbay.settings import Settings

BANDWIDTH = "PODBAY_RUNTIME_EGRESS_BANDWIDTH_MBIT"
CONNECTIONS = "PODBAY_RUNTIME_EGRESS_NEW_CONNECTIONS_PER_SECOND"


def settings(data_dir: Path, **environ: str) -> Settings:
    return Settings.load(environ=environ, data_dir=data_dir)


@pytest.mark.parametrize("make", [OciDriver, VmDriver])
def test_every_class_gets_the_configured_budgets(tmp_path: Path, make: type) -> None:
    assert make(settings(tmp_path)).network.budgets == NO_BUDGETS
    capped = make(settings(tmp_path, **{BANDWIDTH: "40", CONNECTIONS: "10"}))
    assert capped.network.budgets == Budgets(bandwidth_mbit=40, new_connections_per_second=10)


@pytest.mark.parametrize(
    ("name", "value", "setting"),
    [
        (BANDWIDTH, -1, "runtime.egress_bandwidth_mbit"),
        (BANDWIDTH, MAX_BANDWIDTH_MBIT + 1, "runtime.egress_bandwidth_mbit"),
        (CONNECTIONS, -5, "runtime.egress_new_connections_per_second"),
        (
            CONNECTIONS,
            MAX_NEW_CONNECTIONS_PER_SECOND + 1,
            "runtime.egress_new_connections_per_second",
        ),
    ],
)
@pytest.mark.parametrize("make", [OciDriver, VmDriver])
def test_a_budget_out_of_range_is_refused_naming_the_setting(
    tmp_path: Path, make: type, name: str, value: int, setting: str
) -> None:
    with pytest.raises(
        DriverError, match=rf"{setting} must be 0 \(no cap\) or 1 to \d+, not {value}"
    ):
        make(settings(tmp_path, **{name: str(value)}))


def test_the_bounds_are_accepted_and_a_non_number_is_refused(tmp_path: Path) -> None:
    top = {BANDWIDTH: str(MAX_BANDWIDTH_MBIT), CONNECTIONS: str(MAX_NEW_CONNECTIONS_PER_SECOND)}
    assert OciDriver(settings(tmp_path, **top)).network.budgets == Budgets(
        MAX_BANDWIDTH_MBIT, MAX_NEW_CONNECTIONS_PER_SECOND
    )
    with pytest.raises(ValueError, match=f"{BANDWIDTH}='40mbit' is not a valid int"):
        settings(tmp_path, **{BANDWIDTH: "40mbit"})


def test_no_budget_adds_nothing() -> None:
    for build in (build_ruleset, build_tap_ruleset):
        assert build() == build(budgets=Budgets(bandwidth_mbit=40))
        assert "limit" not in build()
        assert "budget" not in build()


def test_the_connection_rate_has_a_chain_of_its_own_after_the_policy() -> None:
    budgets = Budgets(new_connections_per_second=10)
    deny_all = EgressPolicy.parse({"internet": False})
    for policy in (None, deny_all):
        kw = {"egress": policy} if policy else {}
        rules = build_ruleset(**kw, budgets=budgets)  # type: ignore[arg-type]
        assert "limit new_connections {\n\t\trate over 10/second burst 5 packets\n\t}" in rules
        budget = rules[rules.index("chain budget") :]
        # Its own base chain, after the policy's (which it cannot loosen: a
        # packet the policy refused ends there), and it survives every swap.
        assert "hook output priority filter + 10; policy accept;" in budget
        assert budget.index('oifname "lo" accept') < budget.index("ct state new")
        # A flow's first packet only: later ones of a flow not yet answered
        # are "new" to conntrack too, but their entry is confirmed.
        first = "ct state new ct status & confirmed == 0"
        assert f'{first} meta l4proto tcp limit name "new_connections"' in budget
        assert 'reject with tcp reset comment "connection-rate"' in budget
        assert f'{first} meta l4proto != tcp limit name "new_connections"' in budget
        assert 'admin-prohibited comment "flow-rate"' in budget
        assert build_ruleset(**kw, budgets=budgets, replace=True).endswith(rules)  # type: ignore[arg-type]
    assert Budgets(new_connections_per_second=1000).connection_burst == 100


def test_tap0_counts_only_what_a_user_space_stack_wrote() -> None:
    budgets = Budgets(new_connections_per_second=10)
    rules = build_ruleset(budgets=budgets)
    tap = build_tap_ruleset(budgets=budgets)
    mark = rules[rules.index("meta mark set ") :].split()[3]
    budget = tap[tap.index("chain budget") :]
    assert 'hook egress device "tap0" priority filter + 10; policy accept;' in budget
    # The kernel stack's packets were counted by inet's chain already.
    assert budget.index(f"meta mark {{ {mark}, {CHECK_MARK:#x} }} accept") < budget.index(
        "limit name"
    )
    assert "tcp flags & (syn | ack) == syn limit name" in budget
    assert 'ip protocol udp limit name "new_connections" counter drop comment "flow-rate"' in budget
    # A UDP flow seen in the last minute is no new one; a new one is counted.
    assert budget.index("@udp_flows update @udp_flows") < budget.index("ip protocol udp limit")
    assert "drop" in budget
    assert "reject" not in budget


def test_the_bandwidth_cap_is_a_token_bucket_on_tap0() -> None:
    argv = shaping_argv(Budgets(bandwidth_mbit=40))
    assert argv[:7] == ["tc", "qdisc", "replace", "dev", "tap0", "root", "tbf"]
    assert argv[argv.index("rate") + 1] == "40mbit"
    # A packet larger than the bucket would never leave: tap0 takes 64 KiB ones.
    assert int(argv[argv.index("burst") + 1]) > MTU
    fast = shaping_argv(Budgets(bandwidth_mbit=10_000))
    assert int(fast[fast.index("burst") + 1]) == 10_000 * 1_000_000 // 8 // 50  # 20 ms
    with pytest.raises(ValueError, match="no bandwidth cap"):
        shaping_argv(NO_BUDGETS)
