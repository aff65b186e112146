"""E2B's network options as podbay's egress policy (:mod:`podbay.domain.egress`).

E2B's create body has ``allow_internet_access`` and ``network: {allowOut,
denyOut, dnsServers, ...}``; ``PUT /sandboxes/{id}/network`` replaces the
same egress fields of a running sandbox. E2B's rules combine otherwise than
podbay's, so they are translated, not copied:

- E2B is open by default; ``allow_internet_access: false`` is ``denyOut:
  ["0.0.0.0/0"]`` (``ALL_TRAFFIC``).
- **allow wins over deny** in E2B (an ``allowOut`` entry is an exception to
  ``denyOut``); podbay's deny wins, and its allow list refuses what it does
  not name. So ``denyOut`` with ``ALL_TRAFFIC`` plus ``allowOut`` is podbay's
  allow list, ``ALL_TRAFFIC`` alone is ``internet: false``, and a narrower
  ``denyOut`` with ``allowOut`` exceptions is podbay's deny list of what is
  left of the denied CIDRs once the allowed ones are cut out of them.
- ``allowOut`` takes CIDRs, addresses and domain names (``*.`` wildcards);
  ``denyOut`` CIDRs and addresses only; a domain in ``allowOut`` needs
  ``ALL_TRAFFIC`` in ``denyOut`` (E2B refuses it otherwise, and so does podbay).

What podbay cannot do is refused with a 400 naming it (a ``host:port`` entry,
an unknown key); E2B features podbay lacks (``rules``, ``egressProxy``,
public URLs) are 501, as before.

    >>> policy_of(False, None).to_doc()
    {'internet': False}
    >>> policy_of(None, {"allowOut": ["1.1.1.1"], "denyOut": ["0.0.0.0/0"]}).to_doc()
    {'allow': ['1.1.1.1/32']}
    >>> policy_of(None, {"denyOut": ["10.9.0.0/30"], "allowOut": ["10.9.0.1"]}).to_doc()
    {'deny': ['10.9.0.0/32', '10.9.0.2/31']}
"""

from __future__ import annotations

import ipaddress
from typing import Any

from podbay.domain.egress import MAX_ENTRIES, OPEN, EgressPolicy, Network, names, networks
from podbay.domain.egress import parse_entry as podbay_entry
from podbay.errors import ApiError

from .error_responses import E2BError, not_implemented

__all__ = ["ALL_TRAFFIC", "e2b_view", "policy_of"]

#: E2B's ``ALL_TRAFFIC``: in ``denyOut``, everything not in ``allowOut``.
ALL_TRAFFIC = "0.0.0.0/0"
#: E2B's ceiling on ``dnsServers``.
MAX_DNS_SERVERS = 10
#: The egress fields podbay maps; the others of E2B's ``network`` are either
#: E2B features podbay lacks (501) or checked on their own below.
_EGRESS = {"allowOut", "denyOut", "dnsServers"}
_LACKING = {"rules", "egressProxy", "maskRequestHost", "httpsPorts"}
_CREATE_KEYS = _EGRESS | _LACKING | {"allowPublicTraffic"}
_UPDATE_KEYS = _EGRESS | {"rules", "egressProxy", "allow_internet_access", "allowInternetAccess"}


def _invalid(message: str) -> E2BError:
    return E2BError(400, "SANDBOX_NETWORK_INVALID", message)


def _flag(value: object, name: str) -> bool | None:
    if value is None or isinstance(value, bool):
        return value
    raise _invalid(f"{name} must be true or false")


def _entries(doc: dict[str, Any], key: str) -> list[str]:
    value = doc.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise _invalid(f"network.{key} must be a list of strings")
    if len(value) > MAX_ENTRIES:
        raise E2BError(
            400,
            "SANDBOX_NETWORK_TOO_LARGE",
            f"network.{key} has {len(value)} entries; at most {MAX_ENTRIES}",
        )
    out = []
    for item in value:
        if isinstance(item, str) and ":" in item and not _is_ipv6(item):
            raise E2BError(
                400,
                "SANDBOX_NETWORK_ENTRY_INVALID",
                f"network.{key} entry {item[:80]!r}: podbay's rules take no port "
                "(host:port); name the address, CIDR or domain only",
            )
        try:
            out.append(podbay_entry(item))
        except ApiError as exc:
            raise E2BError(400, exc.code.value, f"network.{key}: {exc.message}") from None
    return list(dict.fromkeys(out))


def _is_ipv6(text: str) -> bool:
    try:
        return ipaddress.ip_network(text.split("/", 1)[0]).version == 6
    except ValueError:
        return False


def _dns_servers(doc: dict[str, Any]) -> list[str]:
    value = doc.get("dnsServers")
    if value is None:
        return []
    if not isinstance(value, list) or len(value) > MAX_DNS_SERVERS:
        raise _invalid(f"network.dnsServers is a list of at most {MAX_DNS_SERVERS} IPv4 addresses")
    out = []
    for item in value:
        try:
            out.append(f"{ipaddress.IPv4Address(item)}/32")
        except (ValueError, TypeError):
            raise E2BError(
                400,
                "SANDBOX_NETWORK_ENTRY_INVALID",
                f"network.dnsServers entry {str(item)[:80]!r} is not an IPv4 address",
            ) from None
    return out


def _cut(denied: list[Network], allowed: list[Network]) -> list[Network]:
    """``denied`` less every address of ``allowed``: E2B's "allow wins" as a
    deny list. Refused once it would outgrow podbay's limit."""
    left = list(denied)
    for hole in allowed:
        kept: list[Network] = []
        for net in left:
            if net.version != hole.version or not net.overlaps(hole):
                kept.append(net)
            elif not net.subnet_of(hole):  # type: ignore[arg-type]
                kept.extend(net.address_exclude(hole))  # type: ignore[arg-type]
            if len(kept) > MAX_ENTRIES:
                raise E2BError(
                    400,
                    "SANDBOX_NETWORK_TOO_LARGE",
                    f"denyOut less the allowOut exceptions is more than {MAX_ENTRIES} CIDRs "
                    "in podbay's rules (where deny wins); deny fewer, wider ranges",
                )
        left = kept
    return sorted(left, key=lambda net: (net.version, int(net.network_address)))


def _translate(internet: bool | None, doc: dict[str, Any]) -> EgressPolicy:
    allow, deny = _entries(doc, "allowOut"), _entries(doc, "denyOut")
    dns = _dns_servers(doc)
    if names(deny):
        raise E2BError(
            400,
            "SANDBOX_NETWORK_ENTRY_INVALID",
            f"network.denyOut {names(deny)[0]!r}: denyOut takes IP addresses and CIDRs only "
            "(as E2B's does)",
        )
    deny_all = internet is False or ALL_TRAFFIC in deny
    if names(allow) and not deny_all:
        raise _invalid(
            "a domain in network.allowOut needs 'ALL_TRAFFIC' (0.0.0.0/0) in denyOut "
            "(or allow_internet_access false) to block all other traffic, as in E2B"
        )
    if deny_all:
        if not allow:
            return EgressPolicy(internet=False)
        # E2B opens its DNS servers only for a domain rule; podbay's own
        # resolver answers allowed names, so none is opened unless named.
        extra = dns if names(allow) else []
        return EgressPolicy.parse({"allow": allow + extra})
    left = _cut(networks(deny), networks(allow))
    return EgressPolicy.parse({"deny": [str(net) for net in left]}) if left else OPEN


def policy_of(allow_internet_access: object, network: object) -> EgressPolicy | None:
    """The policy of a create body's ``allow_internet_access`` and ``network``;
    None when they restrict nothing (the deployment's default then applies,
    as for an attach that names no ``network``)."""
    internet = _flag(allow_internet_access, "allow_internet_access")
    if network is None:
        return None if internet is not False else EgressPolicy(internet=False)
    if not isinstance(network, dict):
        raise _invalid("network must be an object")
    _check_keys(network, _CREATE_KEYS)
    for key in sorted(_LACKING):
        if network.get(key):
            raise not_implemented(f"network.{key}")
    if _flag(network.get("allowPublicTraffic"), "network.allowPublicTraffic"):
        # podbay's sandbox URLs always want the sandbox's traffic token.
        raise not_implemented("network.allowPublicTraffic true (URLs without the token)")
    policy = _translate(internet, network)
    # Open (an allowOut with nothing denied is a no-op in E2B too): the
    # deployment's default stands, as when nothing was named.
    return None if policy.open else policy


def update_policy(body: dict[str, Any]) -> EgressPolicy:
    """The policy of ``PUT /sandboxes/{id}/network``: the whole egress
    configuration (a field left out is cleared, as in E2B)."""
    _check_keys(body, _UPDATE_KEYS)
    for key in ("rules", "egressProxy"):
        if body.get(key):
            raise not_implemented(f"network.{key}")
    snake, camel = body.get("allow_internet_access"), body.get("allowInternetAccess")
    if snake is not None and camel is not None and snake != camel:
        raise _invalid("allow_internet_access and allowInternetAccess disagree")
    internet = _flag(snake if snake is not None else camel, "allow_internet_access")
    return _translate(internet, body)


def _check_keys(doc: dict[str, Any], known: set[str]) -> None:
    unknown = sorted(str(k)[:40] for k in doc if k not in known)
    if unknown:
        raise _invalid(f"network has unknown keys {unknown}; podbay takes {sorted(known)}")


def e2b_view(policy: EgressPolicy) -> tuple[bool, dict[str, list[str]] | None]:
    """``allowInternetAccess`` and ``network`` of E2B's sandbox detail for
    ``policy``. ``network`` is None for a policy E2B's form cannot say (set
    through podbay's own API: a domain deny, or allow and deny together);
    ``GET /api/v1/sandboxes/{id}/network`` shows those."""
    if not policy.internet:
        return False, {"denyOut": [ALL_TRAFFIC]}
    if policy.allow and policy.deny:
        return False, None
    if policy.allow:
        return False, {"allowOut": list(policy.allow), "denyOut": [ALL_TRAFFIC]}
    if policy.deny:
        return True, None if names(policy.deny) else {"denyOut": list(policy.deny)}
    return True, None
