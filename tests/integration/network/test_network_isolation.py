"""What a sandbox can and cannot reach, seen from inside its network namespace.

Probes run the way a container does: an unprivileged host uid that is root only
inside a user namespace of its own, joined to the sandbox's network namespace.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from pathlib import Path

import pytest
from _nethelpers import (
    METADATA_ADDRESS,
    PREFIX,
    PRIVATE_HOST_ADDRESS,
    PROBE_PYTHON,
    PUBLIC_HOST_ADDRESS,
    NetLab,
    in_netns,
    probe,
    sh,
    spawn_server,
    stop,
)

from podbay.runtime.network import NetworkManager
from podbay.runtime.network.policy import SLIRP_DNS, SLIRP_GATEWAY

# One DNS query for "example.com", type A.
DNS_QUERY = "123401000001000000000000076578616d706c6503636f6d0000010001"


@pytest.fixture
def sandbox(manager: NetworkManager, runner: asyncio.Runner) -> Path:
    return runner.run(manager.setup("sbx")).netns_path


def test_reaches_the_test_host(sandbox: Path, testnet: NetLab) -> None:
    [(result, _)] = probe(sandbox, [("tcp", testnet.testhost_address, testnet.testhost_port, "")])
    assert result == "connected:testhost\n"


def test_own_loopback_works(sandbox: Path) -> None:
    server = spawn_server(sandbox, 9000, "inside\n")
    try:
        deadline = time.monotonic() + 10
        while True:
            results = probe(sandbox, [("tcp", "127.0.0.1", 9000, ""), ("tcp", "::1", 9000, "")])
            if results[0][0].startswith("connected") or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert results[0][0] == "connected:inside\n"
        # The server listens on 0.0.0.0 only, so ::1 is refused, by the kernel, fast.
        assert results[1][0] == "ECONNREFUSED"
        # Its own tap address is local too: through lo, never out.
        [(own, _)] = probe(sandbox, [("tcp", "10.0.2.100", 9000, "")])
        assert own == "connected:inside\n"
    finally:
        stop(server)


def blocked_targets(testnet: NetLab) -> list[tuple[str, str]]:
    """(label, host address with a listening server) the sandbox must not reach."""
    named = {
        "127.0.0.1": "host loopback",
        PRIVATE_HOST_ADDRESS: "private address on the host",
        METADATA_ADDRESS: "cloud metadata address on the host",
        PUBLIC_HOST_ADDRESS: "public-looking address on the host",
        testnet.host_side_address: "host end of the test host's link",
    }
    return [(named.get(a, f"host's own address {a}"), a) for a in testnet.servers]


def test_host_addresses_are_unreachable(sandbox: Path, testnet: NetLab) -> None:
    targets = blocked_targets(testnet)
    assert any(label.startswith("host's own") for label, _ in targets), targets
    before = {a: s.accepted for a, s in testnet.servers.items()}
    results = probe(sandbox, [("tcp", a, testnet.servers[a].port, "") for _, a in targets])
    for (label, address), (result, seconds) in zip(targets, results, strict=True):
        assert not result.startswith("connected"), f"{label} ({address}) reachable"
        if ":" not in address:
            # A TCP reset from the rules: the client learns at once.
            assert result == "ECONNREFUSED", (label, result)
            assert seconds < 1.0, (label, seconds)
    assert {a: s.accepted for a, s in testnet.servers.items()} == before


def test_slirp_gateway_does_not_lead_to_host_loopback(sandbox: Path, testnet: NetLab) -> None:
    loopback = testnet.servers["127.0.0.1"]
    before = loopback.accepted
    [(result, _)] = probe(sandbox, [("tcp", SLIRP_GATEWAY, loopback.port, "")])
    assert result == "ECONNREFUSED"
    assert loopback.accepted == before


def test_udp_to_blocked_address_is_refused(sandbox: Path, testnet: NetLab) -> None:
    assert testnet.udp is not None
    targets = [
        ("udp", PUBLIC_HOST_ADDRESS, testnet.udp.port, "00"),
        ("udp", "224.0.0.251", 5353, "00"),  # multicast
    ]
    results = probe(sandbox, targets)
    # Refused on the way out: the send fails (EPERM) or the ICMP error lands.
    assert all(r in ("EPERM", "EHOSTUNREACH") for r, _ in results), results
    time.sleep(0.2)
    assert testnet.udp.received == 0


@pytest.mark.parametrize(
    "address",
    ["10.1.2.3", "172.16.0.1", "192.168.1.1", "100.64.0.1", "169.254.1.1", "0.0.0.1", "240.0.0.1"],
)
def test_private_ranges_are_refused_locally(sandbox: Path, address: str) -> None:
    # Nothing listens there; the point is that the packet never leaves: the
    # rules answer with a reset, counted on the "blocked" rule.
    [(result, seconds)] = probe(sandbox, [("tcp", address, 80, "")])
    assert result == "ECONNREFUSED"
    assert seconds < 1.0


def test_ipv6_off_the_loopback_is_refused(sandbox: Path) -> None:
    results = probe(sandbox, [("tcp", "2001:db8::1", 80, ""), ("tcp", "fd00::1", 80, "")])
    assert all(not r.startswith("connected") for r, _ in results)


def _counters(netns: Path, table: str = "inet podbay") -> dict[str, int]:
    """Packets per rule comment in ``table``'s output chain."""
    done = in_netns(netns, "nft", "-j", "list", "table", *table.split(), sandbox=False)
    assert done.returncode == 0, done.stderr
    counts: dict[str, int] = {}
    for item in json.loads(done.stdout)["nftables"]:
        rule = item.get("rule")
        if not rule:
            continue
        packets = sum(e["counter"]["packets"] for e in rule["expr"] if "counter" in e)
        key = rule.get("comment", f"{rule['chain']}#{rule['handle']}")
        counts[key] = counts.get(key, 0) + packets
    return counts


def test_dns_to_slirp_passes_the_rules(sandbox: Path) -> None:
    # A second table, later on the same hook, counts what podbay's accepted
    # and drops it, so the query is proved allowed without leaving the machine.
    sh(
        "nsenter",
        f"--net={sandbox}",
        "--",
        "nft",
        "-f",
        "-",
        input=(
            "table inet podbaytest {\n"
            " chain out {\n"
            "  type filter hook output priority filter + 10; policy accept;\n"
            f'  ip daddr {SLIRP_DNS} counter drop comment "after-podbay"\n'
            " }\n"
            "}\n"
        ).encode(),
    )
    results = probe(
        sandbox,
        [
            ("udp", SLIRP_DNS, 53, DNS_QUERY),
            ("tcp", SLIRP_DNS, 53, ""),
            ("udp", SLIRP_DNS, 54, "00"),  # not DNS: blocked like the rest of 10/8
        ],
    )
    # A local drop (by the test's table) is EPERM to the sender.
    assert results[0][0] in ("EPERM", "sent-no-answer")
    assert results[1][0] in ("EPERM", "timeout")
    assert results[2][0] != "answered"
    podbay = _counters(sandbox)
    after = _counters(sandbox, "inet podbaytest")
    assert podbay["dns-udp"] >= 1
    assert podbay["dns-tcp"] >= 1
    assert podbay["blocked"] >= 1
    assert after["after-podbay"] >= 2  # UDP query + TCP SYN(s) got past podbay's rules


def test_sandbox_cannot_change_its_network(sandbox: Path) -> None:
    before = sh("nsenter", f"--net={sandbox}", "--", "nft", "-s", "list", "ruleset")
    sock = "import socket; socket.socket"
    attempts = {
        "flush": ["nft", "flush", "ruleset"],
        "delete": ["nft", "delete", "table", "inet", "podbay"],
        "link": ["ip", "link", "set", "tap0", "down"],
        "addr": ["ip", "addr", "add", "10.9.9.9/32", "dev", "lo"],
        "route": ["ip", "route", "add", "203.0.113.0/24", "dev", "lo"],
        "raw": [PROBE_PYTHON, "-c", f"{sock}(socket.AF_INET, socket.SOCK_RAW, 1)"],
        "packet": [PROBE_PYTHON, "-c", f"{sock}(socket.AF_PACKET, socket.SOCK_RAW)"],
        "sysctl": ["sh", "-c", "echo 1 > /proc/sys/net/ipv4/ip_forward"],
    }  # fmt: skip
    for name, argv in attempts.items():
        done = in_netns(sandbox, *argv)
        assert done.returncode != 0, f"{name} succeeded inside the sandbox"
        if name != "sysctl":
            assert "ermission" in done.stderr or "ermitted" in done.stderr, (name, done.stderr)
    after = sh("nsenter", f"--net={sandbox}", "--", "nft", "-s", "list", "ruleset")
    assert before == after
    assert "tap0" in sh("nsenter", f"--net={sandbox}", "--", "ip", "-br", "link")


def test_other_sandboxes_are_unreachable(
    manager: NetworkManager, runner: asyncio.Runner, testnet: NetLab
) -> None:
    a = runner.run(manager.setup("sbx-a")).netns_path
    b = runner.run(manager.setup("sbx-b")).netns_path
    server = spawn_server(b, 9001, "sandbox b\n")
    try:
        deadline = time.monotonic() + 10
        while not probe(b, [("tcp", "127.0.0.1", 9001, "")])[0][0].startswith("connected"):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        # Every sandbox is 10.0.2.100 behind its own slirp: for A that is itself.
        results = probe(
            a,
            [
                ("tcp", "10.0.2.100", 9001, ""),
                ("tcp", "127.0.0.1", 9001, ""),
                ("tcp", SLIRP_GATEWAY, 9001, ""),
            ],
        )
        assert [r for r, _ in results] == ["ECONNREFUSED"] * 3
        # ...while the test host is reachable from both.
        for netns in (a, b):
            [(r, _)] = probe(netns, [("tcp", testnet.testhost_address, testnet.testhost_port, "")])
            assert r == "connected:testhost\n"
    finally:
        stop(server)


def test_nothing_connects_in(sandbox: Path, manager: NetworkManager, testnet: NetLab) -> None:
    handle_pid = int((manager.machine_dir("sbx") / "slirp.pid").read_text().split()[0])
    # slirp4netns got no API socket and forwards no port: it listens nowhere.
    listening = sh("ss", "-Hlnp", "-A", "inet,unix")
    assert f"pid={handle_pid}," not in listening
    # Even a packet that does arrive is dropped: wire a veth straight into the
    # sandbox's namespace from the test host and knock on a listening port.
    outer, inner = f"{PREFIX}{testnet.pid}a", f"{PREFIX}{testnet.pid}b"
    server = spawn_server(sandbox, 9002, "inside\n")
    in_sbx = ["nsenter", f"--net={sandbox}", "--", "ip"]
    in_th = ["nsenter", f"--net={testnet.testhost_netns}", "--", "ip"]
    try:
        sh("ip", "link", "add", outer, "type", "veth", "peer", "name", inner)
        sh("ip", "link", "set", inner, "netns", str(sandbox))
        sh("ip", "link", "set", outer, "netns", str(testnet.testhost_netns))
        sh(*in_sbx, "addr", "add", "198.18.0.1/30", "dev", inner)
        sh(*in_sbx, "link", "set", inner, "up")
        sh(*in_th, "addr", "add", "198.18.0.2/30", "dev", outer)
        sh(*in_th, "link", "set", outer, "up")
        deadline = time.monotonic() + 10
        while not probe(sandbox, [("tcp", "127.0.0.1", 9002, "")])[0][0].startswith("connected"):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        [(result, _)] = probe(
            testnet.testhost_netns, [("tcp", "198.18.0.1", 9002, "")], sandbox=False
        )
        assert result == "timeout"
        assert _counters(sandbox).get("inbound", 0) >= 1
    finally:
        stop(server)
        sh(
            "nsenter",
            f"--net={testnet.testhost_netns}",
            "--",
            "ip",
            "link",
            "del",
            outer,
            check=False,
        )
        sh("ip", "link", "del", outer, check=False)


def test_without_the_rules_slirp_alone_would_reach_the_host(testnet: NetLab) -> None:
    """Why the rules exist: --disable-host-loopback still lets a namespace reach
    the host's other addresses (DESIGN.md, "Measured on these machines")."""
    netns = testnet.workdir / "bare"
    netns.touch()
    sh("unshare", f"--net={netns}", "true")
    slirp = subprocess.Popen(
        ["slirp4netns", "--configure", "--disable-host-loopback", "--netns-type=path",
         str(netns), "tap0"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 10
        while "10.0.2.100" not in sh("nsenter", f"--net={netns}", "--", "ip", "-br", "addr"):
            assert time.monotonic() < deadline
            time.sleep(0.02)
        server = testnet.servers[PUBLIC_HOST_ADDRESS]
        [(result, _)] = probe(netns, [("tcp", PUBLIC_HOST_ADDRESS, server.port, "")])
        assert result.startswith("connected:host")
    finally:
        stop(slirp)
        sh("umount", str(netns), check=False)
        netns.unlink()
