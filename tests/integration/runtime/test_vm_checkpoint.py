"""Checkpoints of ``vm`` machines (``runtime.checkpoint_classes=vm``): suspend
writes the guest to its data directory and QEMU exits; resume restores it with
its processes running on (see src/podbay/runtime/vm/checkpoint.py).

One TCG guest for the module (a boot costs seconds): a counter and a writer
holding a file open run in it from the start, and each test suspends and
resumes it in its own way (the same driver, a new one adopting, after a
simulated reboot, a tampered image), then checks both carry on: the same
pids, a larger count, a file whose lines run on without a gap. The last tests
stop and destroy a checkpointed machine.
"""

from __future__ import annotations

import os
import shutil
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from podbay.runtime.agent_client import AgentClient
from podbay.runtime.base import DriverError, MachineState
from podbay.runtime.vm import checkpoint, qmp
from podbay.runtime.vm.checkpoint import Checkpoint
from podbay.runtime.vm.driver import VmDriver
from podbay.settings import Settings
from podbay.testing.driver_conformance import node_killed_once_ready
from podbay.testing.fixtures import small_spec
from podbay.testing.vm import VmSession

# Alone: its emulated guest, restored beside another module's load, answered
# its agent too late once (the simulated reboot's last restore, full run).
pytestmark = [pytest.mark.root, pytest.mark.alone]

# Renamed into place: a reader never meets the file empty, between truncation and write.
COUNTER = (
    "i=0; while true; do i=$((i+1)); echo $i > /tmp/counter.new;"
    " mv /tmp/counter.new /tmp/counter; sleep 0.1; done"
)
# Its descriptor 3 stays open on the file from the first line to the last.
WRITER = "exec 3>/workspace/log; i=0; while true; do i=$((i+1)); echo $i >&3; sleep 0.1; done"
# One DNS query to the guest's resolver (through QEMU's network, the machine's
# namespace and its resolver on the host): any answer shows the path works.
DNS_QUERY = """
import socket
q = b"\\x12\\x34\\x01\\x00\\x00\\x01\\x00\\x00\\x00\\x00\\x00\\x00"
q += b"".join(bytes([len(p)]) + p.encode() for p in "probe.invalid".split("."))
q += b"\\x00\\x00\\x01\\x00\\x01"
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.settimeout(10)
ns = [l.split()[1] for l in open("/etc/resolv.conf") if l.startswith("nameserver")][0]
s.sendto(q, (ns, 53))
print("answered" if s.recv(512)[:2] == b"\\x12\\x34" else "garbled")
"""


@dataclass
class Guest:
    session: VmSession
    machine_id: str
    counter_pid: int
    writer_pid: int

    @property
    def driver(self) -> VmDriver:
        return self.session.driver

    @property
    def agent(self) -> AgentClient:
        return AgentClient(self.driver.agent_socket(self.machine_id))

    @property
    def checkpoint(self) -> Checkpoint:
        return Checkpoint(self.driver.machines / self.machine_id)

    def count(self) -> int:
        return int(self.agent.sh("cat /tmp/counter").stdout)

    def log_lines(self) -> list[int]:
        return [int(line) for line in self.agent.sh("cat /workspace/log").stdout.split()]

    def carries_on(self, count: int, lines: int) -> None:
        """Both processes run on as the same processes, from where they stood."""
        agent = self.agent
        alive = agent.sh(f"kill -0 {self.counter_pid} {self.writer_pid} && echo alive")
        assert alive.stdout == "alive\n", alive
        # The count goes on (a new one would restart at 1).
        for _ in range(600):
            if self.count() > count:
                break
        else:
            raise AssertionError(f"the counter stands at {self.count()}")
        logged = self.log_lines()
        assert len(logged) > lines
        assert logged == list(range(1, len(logged) + 1))
        fd = agent.sh(f"readlink /proc/{self.writer_pid}/fd/3").stdout.strip()
        assert fd == "/workspace/log"


def start_background(agent: AgentClient, script: str) -> int:
    """A process of its own session, which outlives the command that started it."""
    result = agent.sh(f"setsid sh -c '{script}' > /dev/null 2>&1 < /dev/null & echo $!")
    assert result.exit_code == 0, result
    return int(result.stdout)


@pytest.fixture(scope="module")
def session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VmSession]:
    session = VmSession.open(
        tmp_path_factory.mktemp("podbay-vm-ckpt"),
        memory_bytes=512 << 20,
        checkpoint_classes="vm",
    )
    # Cold boots only: a template of the shape would be a second boot in the
    # background that nothing here needs.
    session.driver.templates_enabled = False
    yield session
    session.close()


@pytest.fixture(scope="module")
def guest(session: VmSession) -> Guest:
    machine_id = session.up(small_spec(disk_bytes=256 << 20))
    agent = AgentClient(session.driver.agent_socket(machine_id))
    counter, writer = start_background(agent, COUNTER), start_background(agent, WRITER)
    counted = agent.sh("while ! test -s /tmp/counter || ! test -s /workspace/log; do :; done")
    assert counted.exit_code == 0, counted
    return Guest(session, machine_id, counter, writer)


def qemu_rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def processes_of(machine_id: str) -> list[int]:
    """Host processes whose command line names the machine (its QEMU would)."""
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if f"podbay-{machine_id}".encode() in (proc / "cmdline").read_bytes():
                    found.append(int(proc.name))
            except OSError:
                continue
    return found


def test_the_setting_chooses_checkpoints_for_the_vm_class() -> None:
    assert not VmDriver(Settings.load(environ={})).checkpoints
    on = {"PODBAY_RUNTIME_CHECKPOINT_CLASSES": "gvisor,vm"}
    assert VmDriver(Settings.load(environ=on)).checkpoints


def test_a_counter_and_an_open_file_carry_on_across_a_checkpoint(guest: Guest) -> None:
    driver, run, mid = guest.driver, guest.session.run, guest.machine_id
    count, lines = guest.count(), len(guest.log_lines())
    pid = driver.qemu_pid(mid)
    assert pid is not None
    rss_before = qemu_rss_kib(pid)
    started = time.perf_counter()
    run(driver.suspend(mid))
    took = time.perf_counter() - started
    assert run(driver.state(mid)) is MachineState.SUSPENDED
    # Nothing of the guest is left on the host but files: no QEMU, no cgroup.
    assert driver.qemu_pid(mid) is None
    assert processes_of(mid) == []
    assert driver.cgroups.existing(driver.cgroup(mid)) == []
    assert not driver.network.active(mid)
    # The host's alone: root's, 0700 and 0600, beside the disk (no guest reaches it).
    saved = guest.checkpoint
    assert saved.exists()
    assert stat.S_IMODE(saved.root.stat().st_mode) == 0o700
    for path in saved.root.iterdir():
        assert path.stat().st_uid == 0
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    state_bytes = saved.state.stat().st_size
    print(
        f"\ncheckpoint: {took:.2f} s; QEMU RSS before {rss_before >> 10} MiB, after: no process;"
        f" state file {state_bytes / (1 << 20):.1f} MiB"
    )
    started = time.perf_counter()
    run(driver.resume(mid))
    assert guest.agent.sh("echo back").stdout == "back\n"
    print(f"restore to first command: {time.perf_counter() - started:.2f} s")
    assert run(driver.state(mid)) is MachineState.RUNNING
    assert not saved.exists()  # stale once the guest runs
    guest.carries_on(count, lines)


def test_the_guests_network_and_clock_work_after_a_restore(guest: Guest) -> None:
    driver, run, mid, agent = guest.driver, guest.session.run, guest.machine_id, guest.agent
    assert agent.exec(["python3", "-c", DNS_QUERY]).stdout == "answered\n"
    run(driver.suspend(mid))
    # Time passes while it is on disk (what is tested, not a wait for an
    # event): its wall clock must not stay behind.
    time.sleep(2)
    run(driver.resume(mid))
    query = agent.exec(["python3", "-c", DNS_QUERY], timeout_ms=30_000)
    assert query.stdout == "answered\n", query
    guest_now = float(agent.sh("date +%s.%N").stdout)
    assert abs(guest_now - time.time()) < 2
    # Its timers run: a command's own timeout and one the agent enforces.
    assert agent.sh("timeout 1 sleep 5").exit_code == 124
    timed = agent.exec(["sleep", "5"], timeout_ms=1000)
    assert timed.timed_out
    assert agent.sh("sleep 1 && echo slept").stdout == "slept\n"


def test_a_new_driver_adopts_a_checkpointed_machine_and_restores_it(guest: Guest) -> None:
    # The server killed: its driver is left as it is (never closed) and a new
    # one on the same directories takes over.
    run, mid = guest.session.run, guest.machine_id
    count, lines = guest.count(), len(guest.log_lines())
    run(guest.driver.suspend(mid))
    # Its record lands first (a killed server's write landed or never happens;
    # here two drivers in one process would write the same temporary file).
    run(guest.driver._writes_done())
    fresh = VmDriver(guest.session.settings)
    try:
        adopted = {o.machine_id: o.state for o in run(fresh.adopt())}
        assert adopted == {mid: MachineState.SUSPENDED}
        run(fresh.prepare())
        run(fresh.resume(mid))
        guest.carries_on(count, lines)
        run(fresh.suspend(mid))  # handed back, on disk, to the module's driver
    finally:
        run(fresh.close())
    run(guest.driver.resume(mid))
    guest.carries_on(count, lines)


def test_a_machine_a_killed_node_checkpointed_is_adopted_suspended(guest: Guest) -> None:
    # A real node process: it boots a machine, suspends it to disk and is
    # killed with SIGKILL (the conformance suite's helper); this driver adopts.
    session, run = guest.session, guest.session.run
    spec = small_spec(memory_bytes=256 << 20, disk_bytes=256 << 20)  # no template's shape
    node_killed_once_ready(
        "podbay.runtime.vm.driver:VmDriver", session.settings, {"suspended": spec}
    )
    mid = spec.machine_id
    try:
        adopted = {o.machine_id: o.state for o in run(guest.driver.adopt())}
        assert adopted[mid] is MachineState.SUSPENDED
        assert Checkpoint(guest.driver.machines / mid).exists()
        assert processes_of(mid) == []
        run(guest.driver.resume(mid))
        agent = AgentClient(guest.driver.agent_socket(mid))
        assert agent.sh("cat /workspace/mark").stdout == "suspended\n"
    finally:
        run(guest.driver.destroy(mid))


def test_a_checkpointed_machine_survives_a_simulated_reboot(guest: Guest) -> None:
    # Every QEMU gone, the run directory (sockets, network state) and the
    # machines' cgroups gone; a new driver finds the data directory alone.
    settings, run, mid = guest.session.settings, guest.session.run, guest.machine_id
    driver = guest.driver
    count, lines = guest.count(), len(guest.log_lines())
    run(driver.suspend(mid))
    run(driver._writes_done())  # as in the adoption test above
    assert processes_of(mid) == []
    shutil.rmtree(settings.runtime.run_dir)
    driver.cgroups.remove(driver.cgroup(mid))
    driver.cgroups.remove(driver.cgroup_parent)
    assert not Path(settings.runtime.run_dir).exists()
    rebooted = VmDriver(settings)
    try:
        assert {o.machine_id: o.state for o in run(rebooted.adopt())} == {
            mid: MachineState.SUSPENDED
        }
        run(rebooted.prepare())
        run(rebooted.resume(mid))
        guest.carries_on(count, lines)
        assert guest.agent.exec(["python3", "-c", DNS_QUERY]).stdout == "answered\n"
        run(rebooted.suspend(mid))
    finally:
        run(rebooted.close())
    run(driver.resume(mid))
    guest.carries_on(count, lines)


def test_a_tampered_checkpoint_is_refused_and_the_machine_stays_suspended(guest: Guest) -> None:
    driver, run, mid = guest.driver, guest.session.run, guest.machine_id
    count, lines = guest.count(), len(guest.log_lines())
    run(driver.suspend(mid))
    saved = guest.checkpoint
    middle = saved.state.stat().st_size // 2
    with open(saved.state, "r+b") as f:
        f.seek(middle)
        original = f.read(1)
        f.seek(middle)
        f.write(bytes([original[0] ^ 0xFF]))
    with pytest.raises(DriverError, match="sha256"):
        run(driver.resume(mid))
    assert run(driver.state(mid)) is MachineState.SUSPENDED
    assert driver.qemu_pid(mid) is None
    assert processes_of(mid) == []
    assert saved.exists()
    with open(saved.state, "r+b") as f:
        f.seek(middle)
        f.write(original)
    # The disk is part of the state: one written since is refused too.
    disk = driver.machines / mid / "disk.ext4"
    stamp = disk.stat()
    os.utime(disk, ns=(stamp.st_atime_ns, stamp.st_mtime_ns + 1))
    with pytest.raises(DriverError, match="disk changed"):
        run(driver.resume(mid))
    assert run(driver.state(mid)) is MachineState.SUSPENDED
    os.utime(disk, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    run(driver.resume(mid))
    guest.carries_on(count, lines)


def test_gc_beside_a_checkpointed_machine_leaves_it_whole(guest: Guest) -> None:
    # podbay gc adopts first: a checkpointed machine is known (suspended), so
    # neither its files nor its layers are a leftover.
    from podbay.runtime.vm import gc

    driver, run, mid = guest.driver, guest.session.run, guest.machine_id
    count, lines = guest.count(), len(guest.log_lines())
    run(driver.suspend(mid))
    run(driver._writes_done())  # as in the adoption test above
    removed = run(gc.collect(driver))
    assert not any(mid in line for line in removed), removed
    assert guest.checkpoint.exists()
    run(driver.resume(mid))
    guest.carries_on(count, lines)


def test_a_failed_save_leaves_the_guest_suspended_in_memory(
    guest: Guest, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Say the data directory is full: the guest stays stopped in its QEMU (the
    # freezer's way), with a relay again, and resumes from memory.
    driver, run, mid = guest.driver, guest.session.run, guest.machine_id
    count, lines = guest.count(), len(guest.log_lines())

    async def failing(qmp_path: Path, saved: Checkpoint, initrd: Path) -> None:
        await qmp.execute(qmp_path, "stop")
        saved.partial.mkdir(mode=0o700)
        raise DriverError("no space left on device")

    monkeypatch.setattr(checkpoint, "save", failing)
    run(driver.suspend(mid))
    assert run(driver.state(mid)) is MachineState.SUSPENDED
    assert driver.qemu_pid(mid) is not None
    assert not guest.checkpoint.exists()
    assert not guest.checkpoint.partial.exists()
    run(driver.resume(mid))
    guest.carries_on(count, lines)


def test_a_checkpoint_beside_a_live_qemu_resumes_from_memory(guest: Guest) -> None:
    # A node ended after sealing the checkpoint, before killing QEMU: QEMU
    # waits in ``postmigrate``, which is suspended; resume continues it and the
    # stale checkpoint goes.
    driver, run, mid = guest.driver, guest.session.run, guest.machine_id
    count, lines = guest.count(), len(guest.log_lines())
    paths, saved = driver._paths(mid), guest.checkpoint
    run(checkpoint.save(paths.qmp, saved, paths.initrd))
    checkpoint.seal(saved, paths.disk_image)
    assert saved.exists()
    assert driver.qemu_pid(mid) is not None
    assert run(driver.state(mid)) is MachineState.SUSPENDED
    run(driver.resume(mid))
    assert not saved.exists()
    guest.carries_on(count, lines)


def test_stopping_a_checkpointed_machine_keeps_what_its_guest_wrote(guest: Guest) -> None:
    # Not synced: the file is only in the guest's page cache, so in the
    # checkpoint. Stop restores the guest to have it flush, then ends it.
    driver, run, mid = guest.driver, guest.session.run, guest.machine_id
    assert guest.agent.sh("echo unsynced > /workspace/late").exit_code == 0
    run(driver.suspend(mid))
    run(driver.stop(mid))
    assert run(driver.state(mid)) is MachineState.STOPPED
    assert not guest.checkpoint.exists()
    assert processes_of(mid) == []
    run(driver.start(mid))
    assert guest.agent.sh("cat /workspace/late").stdout == "unsynced\n"


def test_destroying_a_checkpointed_machine_removes_its_files(guest: Guest) -> None:
    driver, run, mid = guest.driver, guest.session.run, guest.machine_id
    run(driver.suspend(mid))
    assert guest.checkpoint.exists()
    run(driver.destroy(mid))
    assert run(driver.state(mid)) is MachineState.ABSENT
    assert not (driver.machines / mid).exists()
    assert processes_of(mid) == []


def test_a_machine_restored_from_a_template_checkpoints(session: VmSession) -> None:
    # A template-restored machine's QEMU runs from the template's boot archive
    # (it has none in its run directory): the checkpoint keeps that one.
    driver, run = session.driver, session.run
    spec = small_spec(disk_bytes=256 << 20)
    builder = driver.template_builder
    driver.templates_enabled = True
    try:
        builder.ensure(builder.shape(spec), [])
        run(driver.wait_templates())
        assert builder.ensure(builder.shape(spec), []) is not None
        mid = session.up(spec)
    finally:
        driver.templates_enabled = False
    try:
        pid = driver.qemu_pid(mid)
        assert pid is not None
        assert b"templates/" in Path(f"/proc/{pid}/cmdline").read_bytes()
        agent = AgentClient(driver.agent_socket(mid))
        assert agent.sh("echo in-memory > /dev/shm/kept").exit_code == 0
        run(driver.suspend(mid))
        assert Checkpoint(driver.machines / mid).exists()
        assert driver.qemu_pid(mid) is None
        run(driver.resume(mid))
        assert agent.sh("cat /dev/shm/kept").stdout == "in-memory\n"
    finally:
        run(driver.destroy(mid))
