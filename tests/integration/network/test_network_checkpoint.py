"""A gVisor sandbox checkpointed to disk (``runtime.checkpoint_classes=gvisor``)
has its network made again at restore: it reaches what its policy allows, and
a policy changed while it was on disk is in force. One that made a TCP
connection lately is frozen instead (gVisor cannot save the connection)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from _nethelpers import PROBE, NetLab

from podbay.domain.egress import EgressPolicy
from podbay.runtime.base import MachineState
from podbay.runtime.oci import checkpoint
from podbay.settings import Settings
from podbay.testing.fixtures import DriverSession, Machine, Machines, session_for, settings_for

pytestmark = pytest.mark.root


@pytest.fixture(scope="module")
def oci_settings(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Settings]:
    yield from settings_for(tmp_path_factory, "runsc", checkpoint_classes="gvisor")


@pytest.fixture(scope="module")
def oci_session(oci_settings: Settings) -> Iterator[DriverSession]:
    yield from session_for(oci_settings)


def probe_inside(machine: Machine, targets: list[tuple[str, str, int, str]]) -> list[list]:
    done = machine.agent.exec(["python3", "-c", PROBE, json.dumps(targets)], timeout_ms=30_000)
    assert done.ok, done.stderr
    return json.loads(done.stdout)


def test_the_network_after_a_restore_and_the_freezer_after_a_connection(
    oci_machines: Machines,
    oci_session: DriverSession,
    testnet: NetLab,
    caplog: pytest.LogCaptureFixture,
) -> None:
    driver = oci_session.driver
    m = oci_machines.up()
    home = driver._paths(m.id).home
    testhost = ("tcp", testnet.testhost_address, testnet.testhost_port, "")
    oci_session.run(driver.suspend(m.id))
    assert checkpoint.sealed(home)
    assert not driver.network.active(m.id)  # its namespace and slirp4netns are gone
    oci_session.run(driver.resume(m.id))
    [(result, _)] = probe_inside(m, [testhost])
    assert result == "connected:testhost\n"
    # gVisor cannot save that connection (in TIME_WAIT now): the agent refuses
    # to park, and the sandbox is frozen as without checkpoints.
    oci_session.run(driver.suspend(m.id))
    assert oci_session.run(driver.state(m.id)) is MachineState.SUSPENDED
    assert not checkpoint.sealed(home)
    assert driver.cgroups.frozen(driver._paths(m.id).cgroup)
    assert "SANDBOX_BUSY" in caplog.text  # the agent's refusal, not a timeout
    oci_session.run(driver.resume(m.id))
    [(result, _)] = probe_inside(m, [testhost])
    assert result == "connected:testhost\n"


def test_a_policy_changed_while_on_disk_holds_after_the_restore(
    oci_machines: Machines, oci_session: DriverSession, testnet: NetLab
) -> None:
    driver = oci_session.driver
    m = oci_machines.up()
    testhost = ("tcp", testnet.testhost_address, testnet.testhost_port, "")
    oci_session.run(driver.suspend(m.id))
    assert checkpoint.sealed(driver._paths(m.id).home)
    denied = EgressPolicy.parse({"deny": [testnet.testhost_address]})
    oci_session.run(driver.set_egress(m.id, denied))
    oci_session.run(driver.resume(m.id))
    [(result, _)] = probe_inside(m, [testhost])
    assert result in {"ECONNREFUSED", "timeout"}
    oci_session.run(driver.set_egress(m.id, EgressPolicy()))  # the network itself works
    [(result, _)] = probe_inside(m, [testhost])
    assert result == "connected:testhost\n"
