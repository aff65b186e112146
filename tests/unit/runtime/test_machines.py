"""The bookkeeping every record-keeping driver shares: what a start leaves on disk."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from podbay.domain.egress import EgressPolicy
from podbay.host import records
from podbay.host.layout import MachineDirs
from podbay.runtime.base import DriverError, Limits, MachineSpec, MachineState
from podbay.runtime.machines import RecordKeepingDriver

SPEC = MachineSpec(
    machine_id="m1",
    hostname="h",
    limits=Limits(memory_bytes=1 << 30, cpus=1.0, pids=64, disk_bytes=1 << 30),
)


class Booting(RecordKeepingDriver):
    """Machines that exist as records only; booting one fails when told to."""

    log = logging.getLogger("test.machines")

    def __init__(self, root: Path, *, fail: bool) -> None:
        super().__init__()
        self.root, self.fail = root, fail
        self.running: set[str] = set()
        #: The commanded state on disk while each boot ran.
        self.seen_while_booting: list[MachineState] = []

    @property
    def machines(self) -> Path:
        return self.root

    def _paths(self, machine_id: str) -> MachineDirs:
        return MachineDirs(self.root / machine_id, self.root / "run" / machine_id)

    def _record(self, machine_id: str) -> records.MachineRecord:
        record = records.read(self._paths(machine_id).home)
        assert record is not None
        return record

    def _save(self, record: records.MachineRecord) -> None:
        records.write(self._paths(record.spec.machine_id).home, record)

    async def _observe(self, machine_id: str) -> MachineState:
        return MachineState.RUNNING if machine_id in self.running else MachineState.STOPPED

    async def prepare(self) -> None:
        return None

    async def _boot(self, record: records.MachineRecord) -> None:
        # The record's write runs in a thread meanwhile: wait for it here (a
        # write that waited for the boot to end would never come).
        machine_id = record.spec.machine_id
        for _ in range(1000):
            if self._record(machine_id).commanded is MachineState.RUNNING:
                break
            await asyncio.sleep(0.01)
        self.seen_while_booting.append(self._record(machine_id).commanded)
        if self.fail:
            raise DriverError("the agent did not answer")
        self.running.add(record.spec.machine_id)

    async def _freeze(self, machine_id: str) -> None:
        raise NotImplementedError

    async def _thaw(self, machine_id: str) -> None:
        raise NotImplementedError

    async def release(self, machine_id: str) -> None:
        self.running.discard(machine_id)


def made(driver: Booting) -> None:
    home = driver._paths(SPEC.machine_id).home
    home.mkdir(parents=True)
    records.write(home, records.MachineRecord(SPEC, MachineState.STOPPED))


def test_a_start_is_recorded_while_the_machine_boots(tmp_path: Path) -> None:
    driver = Booting(tmp_path, fail=False)
    made(driver)
    asyncio.run(driver.start(SPEC.machine_id))
    assert driver.seen_while_booting == [MachineState.RUNNING]
    assert driver._record(SPEC.machine_id).commanded is MachineState.RUNNING


def test_a_failed_start_records_the_state_it_found(tmp_path: Path) -> None:
    driver = Booting(tmp_path, fail=True)
    made(driver)
    with pytest.raises(DriverError):
        asyncio.run(driver.start(SPEC.machine_id))
    assert driver._record(SPEC.machine_id).commanded is MachineState.STOPPED


class Freezing(Booting):
    """Running machines that freeze and thaw; each record write waits for ``gate``."""

    def __init__(self, root: Path) -> None:
        super().__init__(root, fail=False)
        self.frozen: set[str] = set()
        self.gate = threading.Event()
        #: The commanded states written, in the order they landed.
        self.written: list[MachineState] = []

    def _save(self, record: records.MachineRecord) -> None:
        self.gate.wait(5)
        super()._save(record)
        self.written.append(record.commanded)

    async def _observe(self, machine_id: str) -> MachineState:
        if machine_id in self.frozen:
            return MachineState.SUSPENDED
        return await super()._observe(machine_id)

    async def _freeze(self, machine_id: str) -> None:
        self.frozen.add(machine_id)

    async def _thaw(self, machine_id: str) -> None:
        self.frozen.discard(machine_id)


def test_suspend_and_resume_wait_for_no_record_write_and_the_next_other_call_does(
    tmp_path: Path,
) -> None:
    driver = Freezing(tmp_path)
    made(driver)
    driver.running.add(SPEC.machine_id)

    async def settled(call: asyncio.Future[None]) -> bool:
        for _ in range(20):
            await asyncio.sleep(0)
        return call.done()

    async def run() -> None:
        await driver.suspend(SPEC.machine_id)  # returns with its write held at the gate
        assert SPEC.machine_id in driver.frozen
        assert driver._record(SPEC.machine_id).commanded is MachineState.STOPPED  # as made
        # Neither waits for the write held at the gate: each is answered at once.
        assert await settled(asyncio.ensure_future(driver.resume(SPEC.machine_id)))
        assert SPEC.machine_id not in driver.frozen
        assert await settled(asyncio.ensure_future(driver.suspend(SPEC.machine_id)))
        assert SPEC.machine_id in driver.frozen
        # A start needs the record as the last call left it: it waits for the writes.
        start = asyncio.ensure_future(driver.start(SPEC.machine_id))
        assert not await settled(start)
        assert SPEC.machine_id in driver.frozen
        driver.gate.set()
        await start
        assert SPEC.machine_id not in driver.frozen
        await driver._writes_done()

    asyncio.run(run())
    # In order, the resume's write replaced by the suspend that followed it before
    # it could start; the newest state last.
    assert driver.written == [MachineState.SUSPENDED, MachineState.SUSPENDED, MachineState.RUNNING]
    assert driver._record(SPEC.machine_id).commanded is MachineState.RUNNING


class _NoNetwork:
    """A machine whose network is down (stopped): nothing to swap."""

    def active(self, machine_id: str) -> bool:
        return False

    async def set_egress(self, machine_id: str, egress: object) -> None:
        raise AssertionError("a stopped machine's rules are loaded at its start")


def test_a_stopped_machines_new_egress_policy_is_recorded_for_its_next_start(
    tmp_path: Path,
) -> None:
    driver = Booting(tmp_path, fail=False)
    driver.network = _NoNetwork()  # type: ignore[assignment]
    made(driver)
    policy = EgressPolicy.parse({"internet": False})
    asyncio.run(driver.set_egress(SPEC.machine_id, policy))
    record = driver._record(SPEC.machine_id)
    assert record.spec.egress == policy
    assert record.commanded is MachineState.STOPPED


class Destroyed(Booting):
    """Running machines a destroy removes: it holds the machine's lock until a
    listing (:meth:`_adopt_records`) has read the record and waits for it."""

    def __init__(self, root: Path) -> None:
        super().__init__(root, fail=False)
        self.listing_waits = asyncio.Event()

    @contextlib.asynccontextmanager
    async def _lock(self, machine_id: str, *, written: bool = True) -> AsyncIterator[None]:
        self.listing_waits.set()  # only the listing asks for it here
        async with super()._lock(machine_id, written=written):
            yield

    async def destroy(self, machine_id: str) -> None:
        async with super()._lock(machine_id):
            await self.listing_waits.wait()
            await self.release(machine_id)
            shutil.rmtree(self._paths(machine_id).home)


def test_a_machine_destroyed_while_the_machines_are_listed_is_left_out(tmp_path: Path) -> None:
    driver = Destroyed(tmp_path)
    home = driver._paths(SPEC.machine_id).home
    home.mkdir(parents=True)
    records.write(home, records.MachineRecord(SPEC, MachineState.RUNNING))
    driver.running.add(SPEC.machine_id)

    async def run() -> list[object]:
        # The destroy takes the lock first; the listing reads the record, then waits.
        _, found = await asyncio.gather(driver.destroy(SPEC.machine_id), driver._adopt_records())
        return list(found)

    assert asyncio.run(run()) == []
    assert not home.exists()
