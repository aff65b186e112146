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
from _namedservers import NamedServers
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
    stop,
    wait_listening,
)

from podbay.runtime.network import NetworkManager
from podbay.runtime.network.decoy import Decoy, decoy_host
from podbay.testing.fixtures import oci_machines, oci_session, oci_settings  # noqa: F401
from podbay.testing.upstream import own_slot, upstream


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
    k = 1 + own_slot(60)  # a /30 of 203.0.113.0/24 of our own: parallel runs don't clash
    link = f"{PREFIX}{pid}h"
    try:
        # The test host itself is podbay.testing.upstream's, which the E2B
        # suite's egress tests use too; this suite adds the host's own side.
        with upstream(workdir, link, f"203.0.113.{4 * k}/30") as host:
            net = NetLab(
                pid=pid,
                workdir=workdir,
                testhost_netns=host.netns,
                testhost_address=host.address,
                host_side_address=host.host_side_address,
                host_link=link,
                testhost_port=host.port,
            )
            try:
                for address in (PRIVATE_HOST_ADDRESS, METADATA_ADDRESS, PUBLIC_HOST_ADDRESS):
                    sh("ip", "addr", "add", f"{address}/32", "dev", link)
                # Servers on the host: loopback, the addresses added above, and every
                # address the host already had (its own public address, e.g. eth0's).
                for address in host_addresses():
                    net.servers[address] = TcpServer(address, f"host {address}\n".encode())
                net.udp = UdpServer(PUBLIC_HOST_ADDRESS)
                for server in net.servers.values():
                    wait_listening(server.host, server.port)  # positive control from the host
                yield net
            finally:
                for proc in net.processes:
                    stop(proc)
                for server in net.servers.values():
                    server.close()
                if net.udp:
                    net.udp.close()
    finally:
        remove_workdir(workdir)


@pytest.fixture(scope="session")
def dnsmasq(testnet: NetLab) -> Iterator[str]:
    """Debian's dnsmasq on the test host, standing in for the internet's DNS:
    allowed.test, denied.test and sub.wild.test are the test host, other.test
    another address."""
    other = testnet.testhost_address.rsplit(".", 1)[0] + ".250"
    proc = subprocess.Popen(
        ["nsenter", f"--net={testnet.testhost_netns}", "--", "dnsmasq", "--keep-in-foreground",
         "--conf-file=/dev/null", "--no-resolv", "--no-hosts", "--bind-interfaces",
         f"--listen-address={testnet.testhost_address}", "--port=53", "--pid-file=",
         f"--address=/allowed.test/{testnet.testhost_address}",
         f"--address=/wild.test/{testnet.testhost_address}",
         f"--address=/denied.test/{testnet.testhost_address}",
         f"--address=/other.test/{other}"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_udp(testnet.testhost_netns, testnet.testhost_address)
        yield testnet.testhost_address
    finally:
        stop(proc)


@pytest.fixture(scope="session")
def named(testnet: NetLab) -> Iterator[NamedServers]:
    """HTTPS and HTTP servers on the test host that answer with the name (SNI,
    Host) a connection gave them."""
    servers = NamedServers(testnet.testhost_netns, testnet.workdir)
    try:
        yield servers
    finally:
        servers.close()


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


@pytest.fixture(scope="session")
def decoy() -> Iterator[Decoy]:
    """``podbay doctor``'s decoy (TEST-NET-1, servers on the ports a bypass
    uses, a witness of what arrived), for the bypass tests of every class."""
    with decoy_host() as found:
        yield found
