"""Real network namespaces, slirp4netns and nftables; needs root.

Traffic in these tests goes only to loopback, to addresses the tests put on the
host themselves, or to a *test host*: a network namespace made here, joined to
the host by a veth pair, with a public-looking address from 203.0.113.0/24.

Every host change is named after this test process (``pbnt<pid>…``) and undone
at the end of the session, even when tests fail; changes left by an earlier run
that was killed are removed at the start when their process is gone.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from _nethelpers import (
    METADATA_ADDRESS,
    NEEDED_TOOLS,
    PREFIX,
    PRIVATE_HOST_ADDRESS,
    PUBLIC_HOST_ADDRESS,
    TMP_PREFIX,
    NetLab,
    TcpServer,
    UdpServer,
    host_addresses,
    remove_stale,
    remove_workdir,
    sh,
    spawn_server,
    stop,
    wait_listening,
)

from podbay.runtime.network import NetworkManager
from podbay.testing.fixtures import oci_machines, oci_session, oci_settings  # noqa: F401


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    reason = None
    if os.geteuid() != 0:
        reason = "network namespaces need root"
    else:
        missing = [tool for tool in NEEDED_TOOLS if shutil.which(tool) is None]
        if missing:
            reason = f"missing tools: {', '.join(missing)}"
    for item in items:
        path = Path(str(item.fspath))
        if path.is_relative_to(here) and path.name != "test_network_rules.py":
            item.add_marker(pytest.mark.root)
            # Under ./run test (CI) a host without the tools fails rather than skips.
            if reason and os.environ.get("PODBAY_TEST_REQUIRE_SANDBOXES") != "1":
                item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="session")
def testnet() -> Iterator[NetLab]:
    remove_stale()
    pid = os.getpid()
    workdir = Path(f"/tmp/{TMP_PREFIX}{pid}")
    workdir.mkdir(mode=0o700)
    k = 1 + pid % 60  # a /30 of 203.0.113.0/24 of our own, so parallel runs don't clash
    net = NetLab(
        pid=pid,
        workdir=workdir,
        testhost_netns=workdir / "testhost",
        testhost_address=f"203.0.113.{4 * k + 2}",
        host_side_address=f"203.0.113.{4 * k + 1}",
        host_link=f"{PREFIX}{pid}h",
    )
    peer = f"{PREFIX}{pid}t"
    try:
        net.testhost_netns.touch()
        sh("unshare", f"--net={net.testhost_netns}", "true")
        sh("ip", "link", "add", net.host_link, "type", "veth", "peer", "name", peer)
        sh("ip", "link", "set", peer, "netns", str(net.testhost_netns))
        for address in (
            f"{net.host_side_address}/30",
            f"{PRIVATE_HOST_ADDRESS}/32",
            f"{METADATA_ADDRESS}/32",
            f"{PUBLIC_HOST_ADDRESS}/32",
        ):
            sh("ip", "addr", "add", address, "dev", net.host_link)
        sh("ip", "link", "set", net.host_link, "up")
        inside = ["nsenter", f"--net={net.testhost_netns}", "--", "ip"]
        sh(*inside, "link", "set", "lo", "up")
        sh(*inside, "link", "set", peer, "name", "eth0")
        sh(*inside, "addr", "add", f"{net.testhost_address}/30", "dev", "eth0")
        sh(*inside, "link", "set", "eth0", "up")
        sh(*inside, "route", "add", "default", "via", net.host_side_address)
        net.processes.append(spawn_server(net.testhost_netns, net.testhost_port, "testhost\n"))
        # Servers on the host: loopback, the addresses added above, and every
        # address the host already had (its own public address, e.g. eth0's).
        for address in host_addresses():
            net.servers[address] = TcpServer(address, f"host {address}\n".encode())
        net.udp = UdpServer(PUBLIC_HOST_ADDRESS)
        for server in net.servers.values():
            wait_listening(server.host, server.port)  # positive control from the host
        wait_listening(net.testhost_address, net.testhost_port)
        yield net
    finally:
        for proc in net.processes:
            stop(proc)
        for server in net.servers.values():
            server.close()
        if net.udp:
            net.udp.close()
        sh("ip", "link", "del", net.host_link, check=False)
        remove_workdir(workdir)


@pytest.fixture(scope="session")
def dnsmasq(testnet: NetLab) -> Iterator[str]:
    """Debian's dnsmasq on the test host, standing in for the internet's DNS:
    allowed.test and sub.wild.test are the test host, other.test another address."""
    other = testnet.testhost_address.rsplit(".", 1)[0] + ".250"
    proc = subprocess.Popen(
        ["nsenter", f"--net={testnet.testhost_netns}", "--", "dnsmasq", "--keep-in-foreground",
         "--conf-file=/dev/null", "--no-resolv", "--no-hosts", "--bind-interfaces",
         f"--listen-address={testnet.testhost_address}", "--port=53", "--pid-file=",
         f"--address=/allowed.test/{testnet.testhost_address}",
         f"--address=/wild.test/{testnet.testhost_address}",
         f"--address=/other.test/{other}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_udp(testnet.testhost_netns, testnet.testhost_address)
        yield testnet.testhost_address
    finally:
        stop(proc)


def wait_udp(netns: Path, address: str) -> None:
    deadline = time.monotonic() + 10
    while f"{address}:53" not in sh("nsenter", f"--net={netns}", "--", "ss", "-lnu"):
        assert time.monotonic() < deadline, "dnsmasq did not start"
        time.sleep(0.05)


# --------------------------------------------------------------------------- managers


@pytest.fixture(scope="session")
def runner() -> Iterator[asyncio.Runner]:
    with asyncio.Runner() as r:
        yield r


@pytest.fixture
def run_dir(testnet: NetLab, request: pytest.FixtureRequest) -> Iterator[Path]:
    path = testnet.workdir / "run" / request.node.name.replace("[", "-").strip("]")[:60]
    path.mkdir(parents=True)
    yield path
    remove_workdir(path)


@pytest.fixture
def manager(run_dir: Path, runner: asyncio.Runner) -> Iterator[NetworkManager]:
    m = NetworkManager(run_dir, True)
    yield m
    for machine_id in m.machines():
        runner.run(m.teardown(machine_id))
