"""Checkpoint to disk for gVisor (``runtime.checkpoint_classes=gvisor``), real runsc.

Suspend writes the sandbox's memory and processes to its data area and ends
everything of it on the host; resume restores it with its processes running
where they left off, also through a new driver (the server killed) and after
a simulated reboot (the run directory, cgroup and network namespace gone).
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from podbay.agent.protocol import HIBERNATE_ENV
from podbay.runtime.base import DriverError, MachineState
from podbay.runtime.oci import checkpoint
from podbay.runtime.oci.driver import OciDriver
from podbay.settings import Settings
from podbay.testing.fixtures import (
    DriverSession,
    Machine,
    Machines,
    session_for,
    settings_for,
    small_spec,
)

pytestmark = pytest.mark.root

#: Counts in /tmp/n and appends each value to a file it holds open (fd 3).
COUNTER = (
    "exec 3>>/workspace/log; i=0; "
    "while :; do i=$((i+1)); echo $i > /tmp/n; echo $i >&3; sleep 0.2; done"
)


@pytest.fixture(scope="module")
def oci_settings(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Settings]:
    yield from settings_for(
        tmp_path_factory, "runsc", checkpoint_classes="gvisor", agent_hibernate_seconds=0.5
    )


@pytest.fixture(scope="module")
def oci_session(oci_settings: Settings) -> Iterator[DriverSession]:
    yield from session_for(oci_settings)


def start_counter(m: Machine) -> int:
    """The counter's pid (inside the sandbox), once it has counted."""
    started = m.sh(f"nohup sh -c '{COUNTER}' >/dev/null 2>&1 </dev/null & echo $!")
    assert started.ok, started
    assert m.sh("while [ ! -s /tmp/n ]; do sleep 0.05; done; cat /tmp/n").ok
    return int(started.stdout)


def count(m: Machine) -> int:
    return int(m.sh("cat /tmp/n").stdout)


def wait_past(m: Machine, value: int) -> int:
    """The counter's value once it is above ``value`` (it still runs)."""
    out = m.sh(f"while [ $(cat /tmp/n) -le {value} ]; do sleep 0.05; done; cat /tmp/n")
    assert out.ok, out
    return int(out.stdout)


def host_processes_of(machine_id: str) -> list[int]:
    """Host processes whose command line names the machine (runsc's sentry,
    gofer, stubs, slirp4netns)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if machine_id.encode() in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
    return found


def assert_checkpointed(session: DriverSession, m: Machine) -> Path:
    """Suspended to disk: nothing of it runs on the host; its image's directory."""
    driver = session.driver
    paths = driver._paths(m.id)
    assert session.run(driver.state(m.id)) is MachineState.SUSPENDED
    assert host_processes_of(m.id) == []
    assert driver.cgroups.procs(paths.cgroup) == []
    image = checkpoint.image_dir(paths.home)
    st = image.stat()
    assert (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid) == (0o700, 0, 0)
    assert checkpoint.sealed(paths.home)
    return image


def test_a_counter_keeps_counting_across_checkpoint_and_restore(
    oci_machines: Machines, oci_session: DriverSession
) -> None:
    driver = oci_session.driver
    m = oci_machines.up()
    pid = start_counter(m)
    before = wait_past(m, 2)
    oci_session.run(driver.suspend(m.id))
    image = assert_checkpointed(oci_session, m)
    size = sum(f.stat().st_size for f in image.iterdir())
    print(f"checkpoint image of an idle counter: {size} bytes")
    oci_session.run(driver.suspend(m.id))  # already suspended: done
    oci_session.run(driver.resume(m.id))
    assert oci_session.run(driver.state(m.id)) is MachineState.RUNNING
    assert not checkpoint.sealed(driver._paths(m.id).home)  # stale once it runs on
    after = wait_past(m, before)
    assert after > before
    assert m.sh(f"cat /proc/{pid}/cmdline | tr '\\0' ' '").stdout.startswith("sh -c exec 3>>")
    # The file it holds open has every value once, in order, across the restore.
    log = [int(v) for v in m.sh("cat /workspace/log").stdout.split()]
    assert log == list(range(1, len(log) + 1))
    assert len(log) >= after - 1


def test_a_checkpointing_machine_s_agent_does_not_hibernate(
    oci_machines: Machines, oci_session: DriverSession
) -> None:
    """Its agent parks for a checkpoint instead (a hibernated one could not):
    it is started without a hibernation delay, whatever the setting."""
    m = oci_machines.up()
    config = json.loads((oci_session.driver._paths(m.id).run / "config.json").read_text())
    assert not [e for e in config["process"]["env"] if e.startswith(f"{HIBERNATE_ENV}=")]


def test_a_second_checkpoint_of_a_restored_machine(
    oci_machines: Machines, oci_session: DriverSession
) -> None:
    driver = oci_session.driver
    m = oci_machines.up()
    start_counter(m)
    value = count(m)
    for _ in range(2):
        oci_session.run(driver.suspend(m.id))
        assert_checkpointed(oci_session, m)
        oci_session.run(driver.resume(m.id))
        value = wait_past(m, value)


def test_a_new_driver_adopts_a_checkpointed_machine_and_restores_it(
    oci_machines: Machines, oci_session: DriverSession
) -> None:
    # The server killed with -9: its driver object is dropped without close.
    m = oci_machines.up()
    pid = start_counter(m)
    before = wait_past(m, 1)
    oci_session.run(oci_session.driver.suspend(m.id))
    # Its record written (the same file a second driver in this process writes).
    oci_session.run(oci_session.driver._writes_done())
    fresh = OciDriver(oci_session.settings)
    try:
        adopted = {o.machine_id: o.state for o in oci_session.run(fresh.adopt())}
        assert adopted[m.id] is MachineState.SUSPENDED
        assert_checkpointed(oci_session, m)
        oci_session.run(fresh.resume(m.id))
    finally:
        oci_session.run(fresh.close())
    assert wait_past(m, before) > before
    assert m.sh(f"test -d /proc/{pid} && echo alive").stdout == "alive\n"


def test_a_tampered_image_is_refused_and_the_machine_stays_suspended(
    oci_machines: Machines, oci_session: DriverSession
) -> None:
    driver = oci_session.driver
    m = oci_machines.up()
    start_counter(m)
    before = count(m)
    oci_session.run(driver.suspend(m.id))
    image = assert_checkpointed(oci_session, m)
    victim = max(image.iterdir(), key=lambda f: f.stat().st_size)
    original = victim.read_bytes()
    middle = len(original) // 2
    victim.write_bytes(original[:middle] + bytes([original[middle] ^ 1]) + original[middle + 1 :])
    with pytest.raises(DriverError, match="does not match its digest"):
        oci_session.run(driver.resume(m.id))
    assert_checkpointed(oci_session, m)  # nothing half-done
    victim.write_bytes(original)
    oci_session.run(driver.resume(m.id))
    assert wait_past(m, before) > before


def test_the_image_is_outside_every_sandbox(
    oci_machines: Machines, oci_session: DriverSession
) -> None:
    driver = oci_session.driver
    m = oci_machines.up()
    other = oci_machines.up()
    start_counter(m)
    oci_session.run(driver.suspend(m.id))
    image = assert_checkpointed(oci_session, m)
    host_path = str(image / "checkpoint.img")
    # No mount of either sandbox has the machine's home (or any parent of it)
    # as its source, and nothing by that name is found inside either.
    for machine in (other,):
        probe = machine.sh(
            f"cat {host_path} 2>&1; cat /proc/self/mountinfo; "
            "find / -xdev -name checkpoint.img 2>/dev/null; echo end"
        )
        assert "No such file" in probe.stdout
        assert str(driver._paths(m.id).home) not in probe.stdout.split("\n", 1)[1]
        assert probe.stdout.rstrip().endswith("end")
        assert "checkpoint.img" not in probe.stdout.split("\n", 1)[1]
    oci_session.run(driver.resume(m.id))
    config = (driver._paths(m.id).run / "config.json").read_text()
    assert str(driver.machines) not in config
    probe = m.sh(f"cat {host_path} 2>&1; find / -xdev -name checkpoint.img 2>/dev/null")
    assert "No such file" in probe.stdout
    assert "checkpoint.img\n" not in probe.stdout.split("\n", 1)[1]


def test_a_hostname_given_while_checkpointed_holds_after_restore(
    oci_machines: Machines, oci_session: DriverSession
) -> None:
    driver = oci_session.driver
    m = oci_machines.up()
    oci_session.run(driver.suspend(m.id))
    assert_checkpointed(oci_session, m)
    oci_session.run(driver.assign(m.id, hostname="while-on-disk", labels={}))
    oci_session.run(driver.resume(m.id))
    assert m.sh("hostname; cat /etc/hostname").stdout == "while-on-disk\nwhile-on-disk\n"


def test_a_checkpointed_machine_stops_and_is_destroyed(
    oci_machines: Machines, oci_session: DriverSession
) -> None:
    driver = oci_session.driver
    m = oci_machines.up()
    assert m.sh("echo kept > /workspace/file && sync").ok
    oci_session.run(driver.suspend(m.id))
    assert_checkpointed(oci_session, m)
    oci_session.run(driver.stop(m.id))
    assert oci_session.run(driver.state(m.id)) is MachineState.STOPPED
    assert not checkpoint.image_dir(driver._paths(m.id).home).exists()
    oci_session.run(driver.start(m.id))
    assert m.sh("cat /workspace/file").stdout == "kept\n"
    oci_session.run(driver.suspend(m.id))
    home = driver._paths(m.id).home
    oci_session.run(driver.destroy(m.id))
    assert oci_session.run(driver.state(m.id)) is MachineState.ABSENT
    assert not home.exists()


def test_a_checkpointed_machine_survives_a_simulated_reboot(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    # Its own data and run directories: the whole run directory goes.
    for settings in settings_for(tmp_path_factory, "runsc", checkpoint_classes="gvisor"):
        first = DriverSession(settings)
        first.run(first.driver.prepare())
        spec = small_spec()
        first.run(first.driver.create(spec))
        first.run(first.driver.start(spec.machine_id))
        m = Machine(spec.machine_id, first)
        pid = start_counter(m)
        before = wait_past(m, 1)
        first.run(first.driver.suspend(spec.machine_id))
        assert_checkpointed(first, m)
        # Every podbay process gone (its driver closed, nothing of the machine
        # runs), then the host's run state: the run directory, every mount in
        # it, runsc's state, the machine's cgroup and network namespace.
        first.run(first.driver.close())
        first.runner.close()
        run_dir = Path(settings.runtime.run_dir)
        owner = (run_dir / "test-session.json").read_bytes()
        subprocess.run(["umount", "-R", "-l", str(run_dir)], check=False, capture_output=True)
        for mount in _mounts_under(run_dir):
            subprocess.run(["umount", "-l", mount], check=False, capture_output=True)
        subprocess.run(["rm", "-rf", "--one-file-system", str(run_dir)], check=True)
        run_dir.mkdir(parents=True)
        (run_dir / "test-session.json").write_bytes(owner)
        assert not first.driver.cgroups.procs(first.driver._paths(spec.machine_id).cgroup)
        second = DriverSession(settings)
        try:
            second.run(second.driver.prepare())
            adopted = {o.machine_id: o.state for o in second.run(second.driver.adopt())}
            assert adopted[spec.machine_id] is MachineState.SUSPENDED
            second.run(second.driver.resume(spec.machine_id))
            m = Machine(spec.machine_id, second)
            assert wait_past(m, before) > before
            assert m.sh(f"test -d /proc/{pid} && echo alive").stdout == "alive\n"
        finally:
            second.close()


def _mounts_under(directory: Path) -> list[str]:
    prefix = str(directory) + "/"
    mounts = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        target = line.split()[4]
        if target.startswith(prefix):
            mounts.append(target)
    return sorted(mounts, key=len, reverse=True)


def test_the_resumed_marker_names_agree() -> None:
    from podbay.agent import park

    assert (checkpoint.RESUMED, checkpoint.PARKED) == (park.RESUMED, park.PARKED)
    assert os.path.basename(park.resumed_marker("/x/agent.sock")) == checkpoint.RESUMED
