"""Isolation of real sandboxes: files, processes, users, limits, the agent's resilience."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from podbay.errors import AgentError, AgentUnreachable
from podbay.runtime.base import MachineState
from podbay.runtime.probes import INIT_ENV_NAMES
from podbay.settings import Settings
from podbay.testing.fixtures import (
    OCI_RUNTIMES,
    DriverSession,
    Machine,
    Machines,
    session_for,
    settings_for,
)
from podbay.wire.data import ExecResult

pytestmark = pytest.mark.root


@pytest.fixture(scope="module", params=OCI_RUNTIMES)
def oci_settings(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Settings]:
    """Every probe here runs against runc and against runsc (gVisor)."""
    yield from settings_for(tmp_path_factory, request.param)


@pytest.fixture(scope="module")
def oci_session(oci_settings: Settings) -> Iterator[DriverSession]:
    yield from session_for(oci_settings)


MIB = 1024 * 1024


def gvisor(session: DriverSession) -> bool:
    return Path(session.settings.runtime.oci_runtime).name == "runsc"


def host_pid(m: Machine) -> int:
    """The sandbox's first host process: runc's init (the agent), or gVisor's sentry."""
    state = m.session.run(m.session.driver.runc.query(m.id))
    assert state is not None
    assert state.pid > 0
    return int(state.pid)


def test_two_sandboxes_see_neither_files_nor_processes(oci_machines: Machines) -> None:
    a, b = oci_machines.up(), oci_machines.up()
    assert a.sh("echo secret-a > /workspace/a.txt && echo secret-a > /tmp/a.txt").ok
    assert a.sh("setsid sleep 1234 </dev/null >/dev/null 2>&1 &").ok
    listing = b.sh("ls /workspace /tmp").stdout
    assert "a.txt" not in listing
    assert b.sh("ps -eo args | grep -c 'sleep 123[4]'").stdout.strip() == "0"
    found = b.sh("grep -rsl 'secret[-]a' / --exclude-dir=proc --exclude-dir=sys | head -1")
    assert found.stdout.strip() == ""
    assert "sleep 1234" in a.sh("ps -eo args").stdout
    # Each sandbox's pid namespace starts with its agent as pid 1.
    assert b.sh("cat /proc/1/cmdline | tr '\\0' ' '").stdout.split() == ["podbay-agent"]


def test_root_inside_is_not_root_outside(
    oci_machines: Machines, oci_session: DriverSession
) -> None:
    m = oci_machines.up()
    assert m.sh("id -u").stdout.strip() == "0"
    uid_base = oci_session.settings.runtime.uid_base
    status = Path(f"/proc/{host_pid(m)}/status").read_text()
    uids = next(line for line in status.splitlines() if line.startswith("Uid:")).split()[1:]
    if gvisor(oci_session):
        # gVisor's kernel runs on the host as nobody; root inside is its own.
        assert {int(u) for u in uids} == {65534}
        return
    assert {int(u) for u in uids} == {uid_base}
    assert m.sh("cat /proc/self/uid_map").stdout.split() == ["0", str(uid_base), "65536"]


def test_hardening(oci_machines: Machines, oci_session: DriverSession) -> None:
    m = oci_machines.up(hostname="hardened")
    assert m.sh("hostname").stdout.strip() == "hardened"
    # No mounting, no new network namespace, masked kernel files.
    assert not m.sh("mount -t tmpfs none /mnt").ok
    assert not m.sh("unshare -n true").ok
    assert not m.sh("head -c1 /proc/kcore").ok or m.sh("head -c1 /proc/kcore").stdout == ""
    assert not m.sh("echo 1 > /proc/sys/kernel/panic").ok
    assert not m.sh("touch /.podbay/agent/x").ok
    assert not m.sh("touch /.podbay/image/x").ok
    raw = m.sh("python3 -c 'import socket; socket.socket(socket.AF_INET, socket.SOCK_RAW, 1)'")
    assert not raw.ok
    caps = int(m.sh("grep CapEff /proc/self/status | cut -f2").stdout.strip(), 16)
    assert not caps & (1 << 21), "CAP_SYS_ADMIN must not be granted"
    assert not caps & (1 << 12), "CAP_NET_ADMIN must not be granted"
    # The agent's socket is a host path: nothing of it inside.
    assert "agent.sock" not in m.sh("find / -xdev -name 'agent.sock' 2>/dev/null").stdout
    if gvisor(oci_session):
        # Its own kernel: gVisor's, not the host's. What runs inside (user
        # namespaces, keyrings) is gVisor's; its environment holds no host secret.
        assert "gVisor" in m.sh("dmesg").stdout
        assert m.sh("uname -r").stdout.strip() != os.uname().release
        env = m.sh("tr '\\0' '\\n' < /proc/1/environ").stdout.split()
        assert env
        assert {e.split("=", 1)[0] for e in env} <= INIT_ENV_NAMES
        return
    # No new namespaces, no kernel keyring.
    assert not m.sh("unshare -U true").ok
    assert not m.sh("python3 -c 'import os; os.unshare(os.CLONE_NEWUSER)'").ok
    # Kernel keyrings are out of reach (sandboxes share the host's session keyring,
    # see runc.py): keyctl(KEYCTL_GET_KEYRING_ID, KEY_SPEC_SESSION_KEYRING) is refused.
    number = {"x86_64": 250, "aarch64": 219}.get(os.uname().machine)
    if number is not None:
        keyctl = m.sh(
            "python3 -c 'import ctypes; libc = ctypes.CDLL(None, use_errno=True); "
            f"r = libc.syscall({number}, 0, -3, 0); print(r, ctypes.get_errno())'"
        )
        assert keyctl.stdout.split() == ["-1", "1"], keyctl  # EPERM
    assert m.sh("grep NoNewPrivs /proc/self/status").stdout.split()[1] == "1"
    assert m.sh("grep Seccomp: /proc/self/status").stdout.split()[1] == "2"
    # Its own cgroup limits are visible (tools size themselves by them), not writable.
    pids_max = "f=/sys/fs/cgroup/pids/pids.max; [ -e $f ] || f=/sys/fs/cgroup/pids.max; "
    assert m.sh(pids_max + "cat $f").stdout.strip() == "256"
    assert not m.sh(pids_max + "echo max > $f").ok
    # No host environment in the sandbox's first process (read from the host:
    # inside, the agent's /proc files are out of reach).
    assert not m.sh("cat /proc/1/environ > /dev/null").ok
    env = Path(f"/proc/{m.init_pid()}/environ").read_bytes().decode().split("\0")
    env = [e for e in env if e]
    assert {e.split("=", 1)[0] for e in env} <= INIT_ENV_NAMES


#: Shell builtins only (no fork: the sandbox may be at its pids limit): how many
#: ``sleep`` processes it holds, and (``kill``) SIGKILL for each.
SLEEPS = (
    "n=0; for p in /proc/[0-9]*; do read c < $p/comm 2>/dev/null || continue; "
    '[ "$c" = sleep ] && n=$((n+1)) && KILL; done; echo sleeps=$n'
)


def test_pids_limit_counts_the_sandboxs_processes(
    oci_machines: Machines, oci_session: DriverSession
) -> None:
    """The pids limit holds the sandbox's processes under each class: close to
    that many run (under gVisor its kernel's own host threads, about 70 idle and
    tens per process, count elsewhere), a fork past it fails, and no command can
    lift it (gVisor: nothing reaches the commands' pids cgroup)."""
    m = oci_machines.up(pids=32)
    many = m.sh("for i in $(seq 24); do setsid sleep 300 </dev/null >/dev/null 2>&1 & done")
    assert many.ok, many
    deadline = time.monotonic() + 10
    while (counted := m.sh(SLEEPS.replace("KILL", "true")).stdout.split()) != ["sleeps=24"]:
        assert time.monotonic() < deadline, counted  # the last ones are still starting
        time.sleep(0.2)
    lift = m.sh(
        "for f in $(find /sys/fs/cgroup -name pids.max -o -name cgroup.procs -o -name tasks); do "
        "echo max > $f && echo wrote $f; echo $$ > $f && echo moved by $f; done 2>/dev/null; "
        "mkdir -p /tmp/cg; mount -t cgroup -o pids none /tmp/cg 2>/dev/null && echo mounted; "
        "unshare -U -r -m --propagation unchanged mount -t cgroup -o pids none /tmp/cg "
        "2>/dev/null && echo mounted in a user namespace; grep CapBnd /proc/self/status"
    )
    assert "wrote" not in lift.stdout, lift
    assert "moved" not in lift.stdout, lift
    assert "mounted" not in lift.stdout, lift
    bounding = int(lift.stdout.split()[-1], 16)
    assert not bounding & (1 << 21), "CAP_SYS_ADMIN must be out of the commands' reach"
    # Past the limit, fork fails (EAGAIN) inside; the sandbox itself goes on.
    # (A subshell: a failed fork ends the shell that tried.)
    over = m.sh(
        "(for i in $(seq 16); do setsid sleep 300 </dev/null >/dev/null 2>&1 & done); "
        + SLEEPS.replace("KILL", "kill -9 ${p#/proc/}")
    )
    assert "fork" in over.stderr, over
    assert 24 <= int(over.stdout.split("sleeps=")[1]) < 32, over
    assert m.sh("echo alive").stdout.strip() == "alive"


def test_fork_bomb_is_contained(oci_machines: Machines, oci_session: DriverSession) -> None:
    bomb, other = oci_machines.up(pids=32), oci_machines.up()
    result: dict[str, object] = {}

    def explode() -> None:
        try:
            result["bomb"] = bomb.sh("f(){ f | f & }; f; sleep 8", timeout_ms=6000)
        # Runc: the agent may fail to answer while pids are exhausted.
        except Exception as e:  # noqa: BLE001
            result["bomb"] = e

    thread = threading.Thread(target=explode)
    thread.start()
    time.sleep(1.5)
    if not gvisor(oci_session):  # gVisor's host cgroup holds its stub processes instead
        cgroup = oci_session.driver.layout.machine(bomb.id).cgroup  # type: ignore[attr-defined]
        pids = oci_session.driver.cgroups.procs(cgroup)  # type: ignore[attr-defined]
        assert len(pids) <= 32
    started = time.monotonic()
    assert other.sh("echo alive").stdout.strip() == "alive"
    assert time.monotonic() - started < 20  # answers while the bomb holds its own limit
    thread.join(30)
    if gvisor(oci_session):
        # The limit holds inside gVisor's kernel (the agent's own threads are
        # outside it): the bomb's forks fail, the sandbox answers throughout.
        assert isinstance(result["bomb"], ExecResult), result
        assert "Cannot fork" in result["bomb"].stderr, result
    assert_comes_back(bomb, oci_session, may_stop=False)


def assert_comes_back(m: Machine, session: DriverSession, *, may_stop: bool) -> None:
    """The sandbox answers again: by itself, or (``may_stop``) once started again
    after it ended."""
    deadline = time.monotonic() + 30
    while True:
        try:
            if m.sh("echo back", timeout_ms=5000).stdout.strip() == "back":
                return
        except (AgentError, AgentUnreachable):
            if may_stop and session.run(session.driver.state(m.id)) is MachineState.STOPPED:
                session.run(session.driver.start(m.id))
                assert m.sh("echo back").stdout.strip() == "back"
                return
        assert time.monotonic() < deadline, "the sandbox's agent never recovered"
        time.sleep(0.5)


def test_memory_hog_is_killed_inside_and_agent_answers(
    oci_machines: Machines, oci_session: DriverSession
) -> None:
    m, other = oci_machines.up(memory_bytes=256 * MIB), oci_machines.up()
    hog_script = "python3 -c 'a = []\nwhile True: a.append(bytearray(16 << 20))'"
    if gvisor(oci_session):
        # gVisor (2022) has no OOM killer of its own: the host's kills its kernel,
        # so the whole sandbox ends at its limit; the neighbour is untouched.
        with contextlib.suppress(AgentUnreachable):
            hog = m.sh(hog_script, timeout_ms=60_000)
            assert hog.exit_code != 0, hog
        assert other.sh("echo fine").stdout.strip() == "fine"
        assert_comes_back(m, oci_session, may_stop=True)
        return
    hog = m.sh(hog_script, timeout_ms=60_000)
    assert hog.exit_code == 137, hog
    assert m.sh("echo still here").stdout.strip() == "still here"


def test_disk_quota(oci_machines: Machines, oci_session: DriverSession) -> None:
    size = 256 * MIB
    m = oci_machines.up(disk_bytes=size)
    fill = m.sh("dd if=/dev/zero of=/workspace/big bs=1M count=400 2>&1; sync")
    assert "No space left" in fill.stdout, fill
    assert m.sh("echo ok > /workspace/small || true; rm /workspace/big && echo freed").ok
    disk = oci_session.driver.layout.machine(m.id).disk_image  # type: ignore[attr-defined]
    assert os.stat(disk).st_blocks * 512 <= size
    # The host's filesystem only ever gave the sandbox its file's blocks (other
    # processes share the host disk, so free space itself is no measure).
    assert os.statvfs(oci_session.settings.data_dir).f_bavail > 0
    assert m.sh("echo fine > /workspace/after && cat /workspace/after").stdout.strip() == "fine"


def test_removing_python_does_not_stop_the_agent(
    oci_machines: Machines, oci_session: DriverSession
) -> None:
    m = oci_machines.up()
    assert m.sh(
        "rm -rf /usr/bin/python3* /usr/lib/python3* /usr/lib/python3.11 "
        "/etc/ld.so.cache /usr/local/lib/python3* && ! command -v python3"
    ).ok
    assert m.sh("echo works").stdout.strip() == "works"
    # A fresh boot on the same files still gets an agent.
    oci_session.run(oci_session.driver.stop(m.id))
    oci_session.run(oci_session.driver.start(m.id))
    assert m.sh("echo rebooted; test ! -e /usr/bin/python3").stdout.strip() == "rebooted"


def test_replacing_agent_paths_inside_is_refused(oci_machines: Machines) -> None:
    m = oci_machines.up()
    assert not m.sh("rm -rf /.podbay/agent").ok or m.sh("test -d /.podbay/agent/podbay").ok
    assert not m.sh("ln -sf /etc/passwd /.podbay/env.json").ok
    assert m.sh("echo ok").ok


def test_destroy_while_suspended_leaves_nothing(
    oci_machines: Machines, oci_session: DriverSession
) -> None:
    # runsc panics deleting a paused container and left it running.
    m = oci_machines.up()
    oci_session.run(oci_session.driver.suspend(m.id))
    oci_session.run(oci_session.driver.destroy(m.id))
    left = [p for p in Path("/proc").iterdir() if p.name.isdigit() and m.id in _cmdline(p)]
    assert left == []
    assert m.id not in oci_session.driver.runc.container_ids()


def _cmdline(proc: Path) -> str:
    try:
        return (proc / "cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return ""
