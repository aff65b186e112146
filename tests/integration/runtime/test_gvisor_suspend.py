"""Suspend and resume of a gVisor machine: the cgroup freezer, no runsc command.

Every ``runsc`` command is a Go process start (27-40 ms) that talks to the
sentry; a frozen sentry never answers one. So the driver freezes the sandbox's
host cgroup, reads runsc's state file, and thaws before anything asks runsc.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from podbay.runtime.base import MachineState
from podbay.runtime.oci import runsc
from podbay.settings import Settings
from podbay.testing.fixtures import DriverSession, Machines, session_for, settings_for

pytestmark = pytest.mark.root


@pytest.fixture(scope="module")
def oci_settings(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Settings]:
    yield from settings_for(tmp_path_factory, "runsc")


@pytest.fixture(scope="module")
def oci_session(oci_settings: Settings) -> Iterator[DriverSession]:
    yield from session_for(oci_settings)


@pytest.fixture
def runsc_calls(
    oci_session: DriverSession, monkeypatch: pytest.MonkeyPatch
) -> list[tuple[str, ...]]:
    """Every ``runsc`` command the driver runs through its wrapper, recorded
    (and still run)."""
    runc = oci_session.driver.runc
    calls: list[tuple[str, ...]] = []
    real = runc.call

    async def recording(*args: str, check: bool = True) -> Any:
        calls.append(args)
        return await real(*args, check=check)

    monkeypatch.setattr(runc, "call", recording)
    return calls


def test_suspend_and_resume_run_no_runsc_command(
    oci_machines: Machines, oci_session: DriverSession, runsc_calls: list[tuple[str, ...]]
) -> None:
    driver = oci_session.driver
    m = oci_machines.up()
    assert m.sh("echo before > /workspace/kept").ok
    cgroup = driver._paths(m.id).cgroup
    runsc_calls.clear()  # the start's own
    for _ in range(2):
        oci_session.run(driver.suspend(m.id))
        assert driver.cgroups.frozen(cgroup)
        assert oci_session.run(driver.state(m.id)) is MachineState.SUSPENDED
        oci_session.run(driver.suspend(m.id))  # already suspended: done
        oci_session.run(driver.resume(m.id))
        assert not driver.cgroups.frozen(cgroup)
        assert oci_session.run(driver.state(m.id)) is MachineState.RUNNING
        # It really runs on: a new process, and what it held before.
        assert m.sh("cat /workspace/kept; echo after").stdout == "before\nafter\n"
    assert runsc_calls == []


def test_a_suspended_machine_stops_with_its_files_and_starts_again(
    oci_machines: Machines, oci_session: DriverSession
) -> None:
    # runsc's delete waits for a frozen sentry forever: release thaws first.
    driver = oci_session.driver
    m = oci_machines.up()
    assert m.sh("echo kept > /workspace/file && sync").ok
    oci_session.run(driver.suspend(m.id))
    oci_session.run(driver.stop(m.id))
    assert oci_session.run(driver.state(m.id)) is MachineState.STOPPED
    assert m.id not in driver.runc.container_ids()
    oci_session.run(driver.start(m.id))
    assert m.sh("cat /workspace/file").stdout == "kept\n"


def test_a_hostname_given_while_suspended_holds_after_resume(
    oci_machines: Machines, oci_session: DriverSession
) -> None:
    driver = oci_session.driver
    m = oci_machines.up()
    oci_session.run(driver.suspend(m.id))
    oci_session.run(driver.assign(m.id, hostname="while-frozen", labels={}))
    oci_session.run(driver.resume(m.id))
    assert m.sh("hostname").stdout == "while-frozen\n"


def test_a_new_driver_adopts_a_suspended_machine_and_resumes_it(
    oci_machines: Machines, oci_session: DriverSession
) -> None:
    # A restarted server: what it learns of a frozen sandbox never asks runsc
    # (whose commands would wait on the frozen sentry for ever).
    from podbay.runtime.oci.driver import OciDriver

    m = oci_machines.up()
    oci_session.run(oci_session.driver.suspend(m.id))
    fresh = OciDriver(oci_session.settings)
    try:
        adopted = {o.machine_id: o.state for o in oci_session.run(fresh.adopt())}
        assert adopted[m.id] is MachineState.SUSPENDED
        oci_session.run(fresh.resume(m.id))
    finally:
        oci_session.run(fresh.close())
    assert m.sh("echo awake").stdout == "awake\n"


@pytest.fixture
def no_runsc_exec(oci_session: DriverSession, monkeypatch: pytest.MonkeyPatch) -> None:
    """A ``runsc exec`` started now (the naming fallback) fails the test."""

    async def refused(container_id: str, hostname: str) -> None:
        raise AssertionError(f"runsc exec to name {container_id} {hostname!r}")

    monkeypatch.setattr(oci_session.driver.runc, "set_hostname", refused)


@pytest.mark.usefixtures("no_runsc_exec")
def test_a_machine_named_later_is_named_without_a_runsc_exec_then(
    oci_machines: Machines, oci_session: DriverSession
) -> None:
    # A warm pool's machine: its privileged naming process waits in it from the
    # start, and the hand-out only gives it the name.
    driver = oci_session.driver
    m = oci_machines.up(named_later=True)
    assert m.sh("hostname").stdout == "sandbox\n"
    listing = "cat /proc/[0-9]*/cmdline | tr '\\0' ' '"
    # podbay's static program, not one of the image's, holds the capability.
    for _ in range(600):  # runsc exec starts it after the machine is up
        if runsc.NAMER_IN_SANDBOX in m.sh(listing).stdout:
            break
    else:
        raise AssertionError("no naming process in the pooled machine")
    oci_session.run(driver.assign(m.id, hostname="handed-out", labels={}))
    assert m.sh("hostname; cat /etc/hostname").stdout == "handed-out\nhanded-out\n"
    # Gone before the owner runs anything: nothing but the agent's own tree.
    assert runsc.NAMER_IN_SANDBOX not in m.sh(listing).stdout
    assert not driver._namers


@pytest.mark.usefixtures("no_runsc_exec")
def test_a_machine_named_later_while_suspended_is_named_on_resume(
    oci_machines: Machines, oci_session: DriverSession
) -> None:
    driver = oci_session.driver
    m = oci_machines.up(named_later=True)
    oci_session.run(driver.suspend(m.id))
    oci_session.run(driver.assign(m.id, hostname="woken", labels={}))
    oci_session.run(driver.resume(m.id))
    assert m.sh("hostname").stdout == "woken\n"


def test_a_machine_named_later_but_destroyed_leaves_no_naming_process(
    oci_machines: Machines, oci_session: DriverSession
) -> None:
    driver = oci_session.driver
    m = oci_machines.up(named_later=True)
    namer = driver._namers[m.id]
    oci_session.run(driver.destroy(m.id))
    assert namer.process.returncode is not None
    assert m.id not in driver._namers


def test_a_machine_whose_naming_process_died_is_named_by_runsc_exec(
    oci_machines: Machines, oci_session: DriverSession
) -> None:
    driver = oci_session.driver
    m = oci_machines.up(named_later=True)
    process = driver._namers[m.id].process
    process.kill()
    oci_session.run(process.wait())
    oci_session.run(driver.assign(m.id, hostname="fallen-back", labels={}))
    assert not driver._namers
    assert m.sh("hostname").stdout == "fallen-back\n"
