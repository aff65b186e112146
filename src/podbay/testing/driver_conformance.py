"""The conformance suite every runtime driver must pass.

Subclass :class:`DriverConformance` in a test module and provide a
``conformance`` fixture returning a :class:`Harness` for your driver::

    class TestOci(DriverConformance):
        @pytest.fixture
        def conformance(self, oci_session):
            return Harness(oci_session.driver, oci_session.run, oci_session.settings,
                           factory="podbay.runtime.oci.driver:OciDriver")

It checks, against real machines: every lifecycle transition and its
idempotent repeat; files surviving suspend/resume and stop/start; a process
running before suspend running after resume, its counter advancing only while
thawed; a stopped machine's disk exported and imported again (a driver that
moves machines between nodes); ``assign``; and ``adopt`` after the node process was killed with
SIGKILL (the driver runs in a child process for that).

:class:`DriverContract` is the part of it about the interface alone (what
holds without a real sandbox: capabilities, lifecycle, unknown machines,
``assign``'s labels, concurrent starts); :class:`DriverConformance` extends it,
so the real drivers run every test of both, and the unit tests' fake driver
runs the contract (``tests/unit/testing/test_fake_driver_conformance.py``).
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pytest

from podbay.domain.egress import EgressPolicy
from podbay.runtime.agent_client import AgentClient
from podbay.runtime.base import Driver, DriverError, MachineSpec, MachineState, MovableDriver
from podbay.settings import Settings

from .fixtures import small_spec

T = TypeVar("T")

# Written by rename so a reader never sees the file between truncate and write.
COUNTER = (
    "setsid sh -c 'i=0; while :; do i=$((i+1)); echo $i > /tmp/counter.new; "
    "mv /tmp/counter.new /tmp/counter; sleep 0.05; done' </dev/null >/dev/null 2>&1 &"
)


async def _collect(chunks: AsyncIterator[bytes]) -> list[bytes]:
    return [chunk async for chunk in chunks]


async def _replay(chunks: list[bytes]) -> AsyncIterator[bytes]:
    for chunk in chunks:
        yield chunk


@dataclass
class Harness:
    driver: Driver
    run: Callable[[Coroutine[Any, Any, Any]], Any]
    settings: Settings
    #: "module:callable" building this driver from :class:`Settings` in a child process.
    factory: str
    created: list[str] = field(default_factory=list)
    #: The driver's background work to wait for before a machine starts again,
    #: so that what it prepares is used (the vm driver's templates).
    settle: Callable[[], Coroutine[Any, Any, Any]] | None = None
    #: Whether a machine's agent answers; the agent's ``/info`` unless given
    #: (a fake driver's machines answer HTTP but are no agent).
    probe: Callable[[str], bool] | None = None

    def spec(self, **kw: Any) -> MachineSpec:
        spec = small_spec(**kw)
        self.created.append(spec.machine_id)
        return spec

    def agent(self, machine_id: str) -> AgentClient:
        return AgentClient(self.driver.agent_socket(machine_id))

    def answers(self, machine_id: str) -> bool:
        if self.probe is not None:
            return self.probe(machine_id)
        return bool(self.agent(machine_id).info())

    def state(self, machine_id: str) -> MachineState:
        return MachineState(self.run(self.driver.state(machine_id)))

    def twice(
        self, step: Callable[[], Coroutine[Any, Any, Any]], machine_id: str, then: MachineState
    ) -> None:
        """Run ``step`` twice (a repeat must be a no-op), each time ending in ``then``."""
        for _ in range(2):
            self.run(step())
            assert self.state(machine_id) is then

    def up(self, **kw: Any) -> str:
        spec = self.spec(**kw)
        self.run(self.driver.create(spec))
        self.run(self.driver.start(spec.machine_id))
        return spec.machine_id

    def sh(self, machine_id: str, script: str) -> str:
        result = self.agent(machine_id).sh(script)
        assert result.exit_code == 0, (script, result)
        return result.stdout

    def counter(self, machine_id: str, past: int = 0, within: float = 30.0) -> int:
        """:data:`COUNTER`'s value once it is above ``past``. Polled, not slept
        for: a guest under TCG on a loaded host can take seconds to start the loop
        or step it (a fixed 0.5 s once found no counter file yet)."""
        deadline = time.monotonic() + within
        while True:
            result = self.agent(machine_id).sh("cat /tmp/counter 2>/dev/null")
            value = result.stdout.strip()
            if result.exit_code == 0 and value.isdigit() and int(value) > past:
                return int(value)
            if time.monotonic() > deadline:
                raise AssertionError(f"the counter never went past {past}: {result}")
            time.sleep(0.1)

    def cleanup(self) -> None:
        for machine_id in self.created:
            self.run(self.driver.destroy(machine_id))


class DriverContract:
    """The Driver interface's contract, without a real sandbox. Inherit, and
    provide a ``conformance`` fixture returning a :class:`Harness`."""

    @pytest.fixture
    def h(self, conformance: Harness) -> Any:
        yield conformance
        conformance.cleanup()

    def check_hostname(self, h: Harness, machine_id: str, hostname: str) -> None:
        """Inside the machine, which a driver without a sandbox has not: nothing here."""

    def test_capabilities_are_declared(self, h: Harness) -> None:
        assert isinstance(h.driver, Driver)
        caps = h.driver.capabilities
        assert isinstance(caps.suspend, bool)
        assert isinstance(caps.stop_keeps_files, bool)
        assert isinstance(h.driver.name, str)
        assert h.driver.name

    def test_lifecycle_with_idempotent_repeats(self, h: Harness) -> None:
        spec = h.spec()
        mid = spec.machine_id
        assert h.state(mid) is MachineState.ABSENT
        h.twice(lambda: h.driver.create(spec), mid, MachineState.STOPPED)
        h.twice(lambda: h.driver.start(mid), mid, MachineState.RUNNING)
        assert h.answers(mid)
        if h.driver.capabilities.suspend:
            h.twice(lambda: h.driver.suspend(mid), mid, MachineState.SUSPENDED)
            h.twice(lambda: h.driver.resume(mid), mid, MachineState.RUNNING)
            assert h.answers(mid)
        h.twice(lambda: h.driver.stop(mid), mid, MachineState.STOPPED)
        h.run(h.driver.start(mid))
        assert h.answers(mid)
        h.twice(lambda: h.driver.destroy(mid), mid, MachineState.ABSENT)

    def test_unknown_machine(self, h: Harness) -> None:
        mid = f"missing-{uuid.uuid4().hex[:8]}"
        assert h.state(mid) is MachineState.ABSENT
        with pytest.raises(DriverError):
            h.run(h.driver.start(mid))
        h.run(h.driver.destroy(mid))  # destroying what is gone succeeds

    def test_unknown_machine_refuses_every_change(self, h: Harness) -> None:
        mid = f"missing-{uuid.uuid4().hex[:8]}"
        changes: list[Callable[[], Coroutine[Any, Any, Any]]] = [
            lambda: h.driver.stop(mid),
            lambda: h.driver.assign(mid, hostname="x", labels={}),
            lambda: h.driver.set_egress(mid, EgressPolicy()),
        ]
        if h.driver.capabilities.suspend:
            changes += [lambda: h.driver.suspend(mid), lambda: h.driver.resume(mid)]
        for change in changes:
            with pytest.raises(DriverError):
                h.run(change())
        assert h.state(mid) is MachineState.ABSENT

    def test_suspend_and_resume_only_from_their_source(self, h: Harness) -> None:
        spec = h.spec()
        h.run(h.driver.create(spec))
        # A stopped machine has nothing to freeze or thaw: refused, still stopped.
        changes = (h.driver.suspend, h.driver.resume) if h.driver.capabilities.suspend else ()
        for change in changes:
            with pytest.raises(DriverError):
                h.run(change(spec.machine_id))
            assert h.state(spec.machine_id) is MachineState.STOPPED
        assert h.state(spec.machine_id) is MachineState.STOPPED

    def test_assign_while_stopped_or_suspended(self, h: Harness) -> None:
        spec = h.spec(hostname="pool-machine")
        h.run(h.driver.create(spec))
        h.run(h.driver.assign(spec.machine_id, hostname="early", labels={"k": "1"}))
        h.run(h.driver.start(spec.machine_id))
        self.check_hostname(h, spec.machine_id, "early")
        if h.driver.capabilities.suspend:
            h.run(h.driver.suspend(spec.machine_id))
            h.run(h.driver.assign(spec.machine_id, hostname="late", labels={"k": "2"}))
            h.run(h.driver.resume(spec.machine_id))
            self.check_hostname(h, spec.machine_id, "late")
        labels = {m.machine_id: m.labels for m in h.run(h.driver.adopt())}
        assert labels[spec.machine_id] == {"k": "2" if h.driver.capabilities.suspend else "1"}

    def test_concurrent_starts(self, h: Harness) -> None:
        import asyncio

        specs = [h.spec() for _ in range(3)]

        async def boot(spec: MachineSpec) -> None:
            await h.driver.create(spec)
            await h.driver.start(spec.machine_id)

        async def all_of() -> None:
            await asyncio.gather(*(boot(s) for s in specs))

        h.run(all_of())
        for spec in specs:
            assert h.answers(spec.machine_id)


class DriverConformance(DriverContract):
    """Inherit, and provide a ``conformance`` fixture returning a :class:`Harness`:
    the contract's tests, and those that need a real sandbox."""

    def check_hostname(self, h: Harness, machine_id: str, hostname: str) -> None:
        assert h.sh(machine_id, "hostname").strip() == hostname

    def test_suspend_keeps_files_and_processes(self, h: Harness) -> None:
        if not h.driver.capabilities.suspend:
            pytest.skip("driver cannot suspend")
        mid = h.up()
        h.sh(mid, "echo before > /workspace/note && " + COUNTER)
        before = h.counter(mid)
        h.run(h.driver.suspend(mid))
        time.sleep(1.0)
        h.run(h.driver.resume(mid))
        after_resume = int(h.sh(mid, "cat /tmp/counter"))
        # ~0.05 s per step: a second frozen must not have counted (allow the
        # few steps between the two reads that were thawed).
        assert after_resume - before < 10, (before, after_resume)
        h.counter(mid, past=after_resume, within=10.0)  # it counts again after resume
        assert h.sh(mid, "cat /workspace/note").strip() == "before"

    def test_stop_start_keeps_files_and_installs(self, h: Harness) -> None:
        if not h.driver.capabilities.stop_keeps_files:
            pytest.skip("driver does not keep files across stop")
        spec = h.spec()
        mid = spec.machine_id
        h.run(h.driver.create(spec))
        h.run(h.driver.start(mid))
        h.sh(
            mid,
            "echo kept > /workspace/file && printf '#!/bin/sh\\necho tool\\n' "
            "> /usr/local/bin/tool && chmod +x /usr/local/bin/tool && " + COUNTER,
        )
        h.run(h.driver.stop(mid))
        if h.driver.capabilities.move:
            # As another node receives it: the stopped machine's disk exported,
            # the machine gone, then made again from the stream alone.
            assert isinstance(h.driver, MovableDriver)
            stream = h.run(_collect(h.driver.export_disk(mid)))
            h.run(h.driver.destroy(mid))
            received = h.run(
                h.driver.import_disk(mid, _replay(stream), layers=spec.layers, env=spec.env)
            )
            assert received.sha256 == received.sent_sha256
            assert h.state(mid) is MachineState.STOPPED
            if h.settle is not None:
                h.run(h.settle())  # e.g. a template ready: it must not replace the disk
        h.run(h.driver.start(mid))
        assert h.sh(mid, "cat /workspace/file").strip() == "kept"
        assert h.sh(mid, "tool").strip() == "tool"
        # A fresh machine: the counter process of the old incarnation is gone.
        ps = h.sh(mid, "ps -eo args")
        assert "while :" not in ps

    def test_the_usual_tools_work(self, h: Harness) -> None:
        # coreutils stats every path with statx(AT_NO_AUTOMOUNT), which an
        # application kernel (gVisor 2022) once refused on every path.
        mid = h.up()
        out = h.sh(
            mid,
            "ls -la / /workspace >/dev/null && stat -c '%U %F' /etc/hostname && "
            "cp -a /etc/hostname /workspace/h && du -s /workspace >/dev/null && "
            "find /etc -maxdepth 1 -name hostname && ls /workspace",
        )
        assert out.split() == ["root", "regular", "file", "/etc/hostname", "h"], out

    def test_env_reaches_commands(self, h: Harness) -> None:
        mid = h.up(env={"PODBAY_TEST_VAR": "hello world"})
        assert h.sh(mid, 'printf %s "$PODBAY_TEST_VAR"') == "hello world"

    def test_assign_sets_hostname_and_labels(self, h: Harness) -> None:
        mid = h.up(hostname="pool-machine")
        assert h.sh(mid, "hostname").strip() == "pool-machine"
        h.run(h.driver.assign(mid, hostname="thread-42", labels={"sandbox": "thread-42"}))
        assert h.sh(mid, "hostname").strip() == "thread-42"
        observed = {m.machine_id: m for m in h.run(h.driver.adopt())}
        assert observed[mid].labels == {"sandbox": "thread-42"}
        assert observed[mid].state is MachineState.RUNNING

    def test_export_layer_serves_other_machines(self, h: Harness, tmp_path: Any) -> None:
        mid = h.up()
        h.sh(
            mid,
            "mkdir -p /opt/tool && echo v1 > /opt/tool/version && rm /usr/bin/less && "
            "rm -rf /etc/apt/apt.conf.d && mkdir /etc/apt/apt.conf.d && "
            "echo mine > /etc/apt/apt.conf.d/only && ln -s /opt/tool/version /opt/link",
        )
        with pytest.raises(DriverError):
            h.run(h.driver.export_layer(mid, tmp_path / "early"))  # still running
        h.run(h.driver.stop(mid))
        layer = tmp_path / "layer"
        h.run(h.driver.export_layer(mid, layer))
        assert (layer / "opt/tool/version").read_text() == "v1\n"
        user = h.spec(layers=(layer,))
        h.run(h.driver.create(user))
        h.run(h.driver.start(user.machine_id))
        assert h.sh(user.machine_id, "cat /opt/link").strip() == "v1"
        assert h.sh(user.machine_id, "test ! -e /usr/bin/less && echo gone").strip() == "gone"
        # Listed by Python: coreutils' ls fails in Debian 12's gVisor (its statx
        # refuses AT_NO_AUTOMOUNT), which is not what this test is about.
        listing = "python3 -c 'import os; print(*os.listdir(\"/etc/apt/apt.conf.d\"))'"
        assert h.sh(user.machine_id, listing).split() == ["only"]
        # The layer is read-only underneath: the user's changes stay in the user's machine.
        h.sh(user.machine_id, "echo v2 > /opt/tool/version")
        assert (layer / "opt/tool/version").read_text() == "v1\n"

    def test_adopt_after_sigkill(self, h: Harness) -> None:
        specs = {"running": h.spec(), "suspended": h.spec(), "stopped": h.spec()}
        if not h.driver.capabilities.suspend:
            del specs["suspended"]
        node_killed_once_ready(h.factory, h.settings, specs)

        observed = {m.machine_id: m.state for m in h.run(h.driver.adopt())}
        for want, spec in specs.items():
            assert observed.get(spec.machine_id) == MachineState(want), (want, observed)
        ids = [m.machine_id for m in h.run(h.driver.adopt())]
        assert len(ids) == len(set(ids)), "adopt reported a machine twice"
        running = specs["running"].machine_id
        assert h.sh(running, "cat /workspace/mark").strip() == "running"
        if "suspended" in specs:
            suspended = specs["suspended"].machine_id
            h.run(h.driver.resume(suspended))
            assert h.sh(suspended, "cat /workspace/mark").strip() == "suspended"
        stopped = specs["stopped"].machine_id
        h.run(h.driver.start(stopped))
        assert h.sh(stopped, "cat /workspace/mark").strip() == "stopped"


def node_killed_once_ready(factory: str, settings: object, specs: dict[str, Any]) -> None:
    """A node process (:mod:`podbay.testing.adopt_child`) builds ``factory``'s
    driver on ``settings``, brings each machine of ``specs`` to its state, and
    is killed with SIGKILL once it says it is ready."""
    payload = pickle.dumps((factory, settings, specs))
    # The with closes the child's pipes, which outlive its kill otherwise.
    with subprocess.Popen(
        [sys.executable, "-m", "podbay.testing.adopt_child"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    ) as child:
        assert child.stdin is not None
        assert child.stdout is not None
        child.stdin.write(payload)
        child.stdin.close()
        line = child.stdout.readline()
        if not line:
            child.wait(10)
            assert child.stderr is not None
            raise AssertionError("child node failed: " + child.stderr.read().decode()[-2000:])
        assert json.loads(line) == {"ready": True}
        os.kill(child.pid, signal.SIGKILL)
        child.wait(10)
