"""A ``vm`` guest's packets obey its namespace's policy (QEMU runs inside it).

One TCG guest for the module: it reaches the test host (a public-looking
address in a namespace of this session), and none of the host's addresses,
its loopback (through either gateway) or the metadata and private ranges.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from _nethelpers import NetLab

from podbay.runtime.agent_client import AgentClient
from podbay.runtime.network.policy import SLIRP_GATEWAY
from podbay.runtime.vm.driver import GUEST_GATEWAY
from podbay.testing.fixtures import small_spec
from podbay.testing.vm import VmSession


@pytest.fixture(scope="module")
def guest(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AgentClient]:
    session = VmSession.open(tmp_path_factory.mktemp("podbay-vm-net"))
    try:
        machine_id = session.up(small_spec(memory_bytes=256 << 20, disk_bytes=256 << 20))
        yield AgentClient(session.driver.agent_socket(machine_id))
    finally:
        session.close()


def connect(agent: AgentClient, host: str, port: int) -> str:
    """What a TCP connect from inside the guest gets: the first line, or the error."""
    result = agent.exec(
        ["timeout", "5", "bash", "-c", f"exec 3<>/dev/tcp/{host}/{port} && head -n1 <&3"],
        timeout_ms=20_000,
    )
    return result.stdout.strip() if result.exit_code == 0 else f"failed: {result.stderr}"


def test_guest_reaches_the_test_host(guest: AgentClient, testnet: NetLab) -> None:
    assert connect(guest, testnet.testhost_address, testnet.testhost_port) == "testhost"


def test_guest_reaches_no_host_address(guest: AgentClient, testnet: NetLab) -> None:
    before = {a: s.accepted for a, s in testnet.servers.items()}
    for address, server in testnet.servers.items():
        if ":" in address:
            continue
        assert connect(guest, address, server.port).startswith("failed"), address
    loopback = testnet.servers["127.0.0.1"].port
    for gateway in (SLIRP_GATEWAY, GUEST_GATEWAY):
        assert connect(guest, gateway, loopback).startswith("failed"), gateway
    assert {a: s.accepted for a, s in testnet.servers.items()} == before
