"""What a connection's first bytes name (runtime/network/sniff.py), on real
ClientHellos (Python's ssl writes them) and hostile ones."""

from __future__ import annotations

import ssl

import pytest

from podbay.domain.egress import EgressPolicy
from podbay.runtime.network.sniff import MAX_PEEK, MORE, OTHER, Malformed, Named, sniff


def client_hello(name: str | None) -> bytes:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    tls = context.wrap_bio(incoming, outgoing, server_hostname=name)
    with pytest.raises(ssl.SSLWantReadError):
        tls.do_handshake()
    return outgoing.read()


def test_a_client_hello_names_its_sni() -> None:
    hello = client_hello("Allowed.Test")
    assert sniff(hello) == Named("tls", ("allowed.test",))
    assert sniff(client_hello(None)) == Named("tls", ())
    # Every prefix waits for more: a client cannot pass by stopping half way.
    assert all(sniff(hello[:cut]) is MORE for cut in range(1, len(hello)))


def test_a_client_hello_split_over_records_is_joined() -> None:
    hello = client_hello("allowed.test")
    body = hello[5:]
    half = len(body) // 2
    split = b"".join(
        b"\x16\x03\x01" + len(part).to_bytes(2, "big") + part for part in (body[:half], body[half:])
    )
    assert sniff(split) == Named("tls", ("allowed.test",))
    assert sniff(split[: 5 + half + 3]) is MORE


def test_hostile_client_hellos_are_malformed() -> None:
    hello = client_hello("allowed.test")
    assert isinstance(sniff(b"\x16\x03\x01\x40\x01"), Malformed)  # record over 16 KiB
    assert isinstance(sniff(b"\x16\x03\x01\x00\x00"), Malformed)
    # The handshake says it is longer than the record it sits in, then ends.
    short = hello[:5] + b"\x01\x00\x00\x05\x03\x03\x00"
    short = short[:3] + (len(short) - 5).to_bytes(2, "big") + short[5:]
    assert sniff(short) is MORE
    body = bytearray(hello)
    body[5] = 0x02  # a ServerHello first
    assert isinstance(sniff(bytes(body)), Malformed)
    weird = hello.replace(b"allowed.test", b"allowed\x00test")
    assert isinstance(sniff(weird), Malformed)
    # A ClientHello declared larger than the check reads.
    big = b"\x16\x03\x01\x40\x00\x01\xff\xff\xff" + b"\x00" * (16_384 - 4)
    assert isinstance(sniff(big), Malformed)
    assert len(big) <= MAX_PEEK


def test_an_http_request_names_its_host() -> None:
    assert sniff(b"GET / HTTP/1.1\r\nHost: Allowed.Test.:80\r\n\r\n") == Named(
        "http", ("allowed.test",)
    )
    assert sniff(b"GET / HTTP/1.0\r\n\r\n") == Named("http", ())
    assert sniff(b"GET / HTTP/1.1\r\nHost: 203.0.113.5\r\n\r\n") == Named("http", ())
    proxied = b"GET http://denied.test/x HTTP/1.1\r\nHost: allowed.test\r\n\r\n"
    assert sniff(proxied) == Named("http", ("allowed.test", "denied.test"))
    assert sniff(b"CONNECT denied.test:443 HTTP/1.1\r\n\r\n") == Named("http", ("denied.test",))
    for prefix in (b"G", b"GET", b"GET ", b"GET / HTTP/1.1\r\nHost: a"):
        assert sniff(prefix) is MORE, prefix
    assert isinstance(sniff(b"GET / HTTP/1.1\r\nHost: a.test\r\nHost: b.test\r\n\r\n"), Malformed)
    assert isinstance(sniff(b"GET / HTTP/1.1\r\nHost: bad name\r\n\r\n"), Malformed)
    assert isinstance(sniff(b"GET /" + b"a" * MAX_PEEK), Malformed)


def test_other_protocols_name_nothing() -> None:
    assert sniff(b"SSH-2.0-OpenSSH_9.2\r\n") is OTHER
    assert sniff(b"PING\r\n") is OTHER
    assert sniff(b"SET key value\r\n") is OTHER
    assert sniff(b"\x00\x00\x00\x08\x04\xd2\x16\x2f") is OTHER  # PostgreSQL's SSLRequest
    assert sniff(b"\x16\x01\x00") is OTHER  # not a TLS 1.x record


def test_a_name_is_judged_by_the_policy() -> None:
    allow = EgressPolicy.parse({"allow": ["allowed.test", "203.0.113.0/24"], "deny": ["d.test"]})
    assert allow.allows_named("allowed.test", "198.51.100.1")
    assert not allow.allows_named("unlisted.test", "198.51.100.1")
    # An address entry opens its addresses whatever name they are given...
    assert allow.allows_named("unlisted.test", "203.0.113.9")
    # ... but a denied name is cut everywhere.
    assert not allow.allows_named("d.test", "203.0.113.9")
    deny = EgressPolicy.parse({"deny": ["*.d.test"]})
    assert deny.allows_named("d.test", "198.51.100.1")
    assert not deny.allows_named("x.d.test.", "198.51.100.1")


def test_a_policy_with_names_redirects_tcp_and_refuses_quic() -> None:
    from podbay.runtime.network.policy import (
        CHECK_MARK,
        build_ruleset,
        build_tap_ruleset,
        names_redirect_batch,
    )

    names = EgressPolicy.parse({"deny": ["d.test"]})
    for rules in (build_ruleset(egress=names), build_tap_ruleset(egress=names)):
        assert "udp dport 443 counter" in rules
        assert '"quic"' in rules
    # The policy's chain runs before the nat chain (-100): it judges the real address.
    assert "priority filter - 150;" in build_ruleset(egress=names)
    cidrs = EgressPolicy.parse({"deny": ["192.0.2.0/24"]})
    assert '"quic"' not in build_ruleset(egress=cidrs)
    assert "priority filter;" in build_ruleset(egress=cidrs)
    redirect = names_redirect_batch(40000, replace=False)
    assert "redirect to :40000" in redirect
    assert f"meta mark {CHECK_MARK:#x} return" in redirect
    assert 'oifname "lo" return' in redirect
    assert "delete table" not in redirect
    assert names_redirect_batch(None, replace=True).count("delete table ip podbay_names") == 1
