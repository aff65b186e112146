"""The egress policy model: its wire form, checked strictly."""

from __future__ import annotations

from typing import Any

import pytest

from podbay.domain.egress import MAX_ENTRIES, OPEN, EgressPolicy, names, networks
from podbay.errors import ApiError


def refused(doc: Any) -> ApiError:
    with pytest.raises(ApiError) as caught:
        EgressPolicy.parse(doc)
    assert caught.value.status == 400
    return caught.value


def test_empty_object_is_open() -> None:
    policy = EgressPolicy.parse({})
    assert policy == OPEN
    assert policy.open
    assert not policy.default_deny
    assert policy.to_doc() == {}


def test_no_internet() -> None:
    policy = EgressPolicy.parse({"internet": False})
    assert not policy.open
    assert policy.default_deny
    assert policy.to_doc() == {"internet": False}


def test_entries_are_canonical_and_kept_in_order() -> None:
    policy = EgressPolicy.parse(
        {
            "allow": ["PyPI.org.", "*.pythonhosted.org", "192.0.2.7", "2001:db8::/32"],
            "deny": ["203.0.113.0/24", "pypi.org", "bad.PyPI.org"],
        }
    )
    assert policy.allow == ("pypi.org", "*.pythonhosted.org", "192.0.2.7/32", "2001:db8::/32")
    assert policy.deny == ("203.0.113.0/24", "pypi.org", "bad.pypi.org")
    assert policy.default_deny
    assert [str(n) for n in networks(policy.allow)] == ["192.0.2.7/32", "2001:db8::/32"]
    assert names(policy.allow) == ["pypi.org", "*.pythonhosted.org"]
    assert EgressPolicy.from_json(policy.to_json()) == policy


def test_a_deny_list_alone_keeps_the_default_open() -> None:
    policy = EgressPolicy.parse({"deny": ["203.0.113.9", "203.0.113.9/32"]})
    assert policy.deny == ("203.0.113.9/32",)  # duplicates dropped
    assert not policy.open
    assert not policy.default_deny


@pytest.mark.parametrize(
    "entry",
    [
        "",
        "pypi",  # one label
        "-pypi.org",
        "pypi-.org",
        "py_pi.org",
        "*pypi.org",
        "pypi.*.org",
        "*.*.org",
        "10.0.0.1/24",  # host bits set
        "10.0.0.0/33",
        "2001:db8::/129",
        "1.2.3",  # all-numeric: not a name
        "exämple.org",
        "a" * 64 + ".org",
        ("a" * 62 + ".") * 4 + "org",  # 255 characters: over 253
        "evil.org\n",
        "evil.org;drop",
        "1.2.3.4 , 5.6.7.8",
        7,
        None,
    ],
)
def test_a_bad_entry_is_refused_by_name(entry: object) -> None:
    error = refused({"allow": [entry]})
    assert error.code.value == "SANDBOX_NETWORK_ENTRY_INVALID"
    if isinstance(entry, str) and entry:
        assert repr(entry[:20])[1:-1] in error.message


@pytest.mark.parametrize(
    "doc",
    [
        [],
        "open",
        {"internet": "no"},
        {"internet": 0},
        {"allow": "pypi.org"},
        {"deny": {"pypi.org": True}},
        {"allowed": []},
        {"internet": False, "allow": ["pypi.org"]},
        {"internet": False, "deny": ["203.0.113.0/24"]},
    ],
)
def test_a_bad_shape_is_refused(doc: Any) -> None:
    assert refused(doc).code.value == "SANDBOX_NETWORK_INVALID"


def test_the_entries_are_bounded() -> None:
    many = [f"198.51.{i // 256}.{i % 256}" for i in range(MAX_ENTRIES + 1)]
    assert refused({"allow": many}).code.value == "SANDBOX_NETWORK_TOO_LARGE"
    half = MAX_ENTRIES // 2 + 1
    error = refused({"allow": many[:half], "deny": many[half : 2 * half]})
    assert error.code.value == "SANDBOX_NETWORK_TOO_LARGE"
    assert EgressPolicy.parse({"allow": many[:MAX_ENTRIES]}).allow[-1] == "198.51.0.255/32"


def test_names_match_exactly_or_under_a_wildcard_and_deny_wins() -> None:
    policy = EgressPolicy.parse(
        {"allow": ["pypi.org", "*.pythonhosted.org", "*.evil.org"], "deny": ["x.evil.org"]}
    )
    assert policy.has_names
    assert policy.allows_name("PyPI.org.")
    assert not policy.allows_name("www.pypi.org")  # no wildcard for it
    assert policy.allows_name("files.pythonhosted.org")
    assert not policy.allows_name("pythonhosted.org")
    assert not policy.allows_name("notpythonhosted.org")
    assert policy.allows_name("y.evil.org")
    assert not policy.allows_name("x.evil.org")
    deny_only = EgressPolicy.parse({"deny": ["*.evil.org"]})
    assert deny_only.allows_name("good.org")
    assert not deny_only.allows_name("a.evil.org")
    assert not EgressPolicy(internet=False).allows_name("good.org")
    assert not EgressPolicy.parse({"allow": ["192.0.2.0/24"]}).has_names
