"""What the drivers that keep a record per machine on disk share (``oci``, ``vm``).

Both keep ``machines/<id>/machine.json`` (spec and commanded state) beside a
sparse ext4 file for the writable layer, serialise calls for one machine with
an asyncio lock, and observe the live state from their own runtime (runc's
state, QEMU's QMP status). What differs is how a machine runs, so each driver
supplies :meth:`_paths`, :meth:`_record`, :meth:`_save`, :meth:`_observe`,
:meth:`_boot`, :meth:`_freeze`, :meth:`_thaw`, :meth:`release` and the directory
of its records; the bookkeeping around them is written once here.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import secrets
import time
from abc import ABC, abstractmethod
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping, Sequence
from pathlib import Path
from typing import Protocol

from podbay.domain.egress import EgressDestination, EgressPolicy
from podbay.host import records, storage
from podbay.host.image import Recipe
from podbay.host.layout import Layout, MachineDirs

from .base import (
    DriverError,
    ForkCopy,
    MachineNotFound,
    MachineSpec,
    MachineState,
    ObservedMachine,
    check_machine_id,
)
from .network import NetworkManager
from .transfer import Received, receive, send


class RecordKeepingDriver(ABC):
    """The shared half of a driver whose machines are records plus a disk file."""

    layout: Layout
    recipe: Recipe
    network: NetworkManager
    #: The driver's own logger (its messages keep their names).
    log: logging.Logger

    def __init__(self) -> None:
        self._locks: dict[str, asyncio.Lock] = {}
        #: Per machine, the task writing its records in a thread (see :meth:`_save_soon`)
        self._writing: dict[str, asyncio.Task[None]] = {}
        #: and the newest record that task has still to write.
        self._unwritten: dict[str, records.MachineRecord] = {}

    @property
    def base_image(self) -> str:
        # One image for every class, and layers in the same (shifted) ownership,
        # so environments built by one class serve the others.
        return self.recipe.key()

    @property
    @abstractmethod
    def machines(self) -> Path:
        """The directory holding one directory (and record) per machine."""

    @abstractmethod
    def _paths(self, machine_id: str) -> MachineDirs: ...

    @abstractmethod
    def _record(self, machine_id: str) -> records.MachineRecord:
        """The machine's record; :class:`MachineNotFound` when there is none."""

    @abstractmethod
    def _save(self, record: records.MachineRecord) -> None: ...

    @abstractmethod
    async def _observe(self, machine_id: str) -> MachineState:
        """What the runtime says the machine is now (never ``absent``)."""

    @abstractmethod
    async def prepare(self) -> None: ...

    @abstractmethod
    async def _boot(self, record: records.MachineRecord) -> None:
        """Start a new incarnation of a stopped machine (its agent answers)."""

    @abstractmethod
    async def _freeze(self, machine_id: str) -> None:
        """Halt a running machine, memory and files kept."""

    @abstractmethod
    async def _thaw(self, machine_id: str) -> None:
        """Let a halted machine run again."""

    @abstractmethod
    async def release(self, machine_id: str) -> None:
        """End the incarnation; the disk stays."""

    @contextlib.asynccontextmanager
    async def _lock(self, machine_id: str, *, written: bool = True) -> AsyncIterator[None]:
        """The machine's lock. With ``written`` it is held once the record writes
        under way have landed: the call finds the record on disk as the last call
        left it. Only suspend and resume do without: they need the record's spec
        alone (which neither changes), and waiting there made each of them pay
        the other's write (its fsync) when they follow each other closely."""
        async with self._locks.setdefault(machine_id, asyncio.Lock()):
            if written:
                await self._written(machine_id)
            yield

    async def _written(self, machine_id: str) -> None:
        writing = self._writing.get(machine_id)
        if writing is not None:
            # Shielded: a caller cancelled while it waits must not drop the writes.
            await asyncio.shield(writing)

    def _save_soon(self, record: records.MachineRecord) -> None:
        """Write ``record`` in a thread, not waiting for it (under the machine's
        lock): a suspend or resume is answered without the write's fsync (ms on
        an idle disk, tens on a busy one; it blocked the loop meanwhile). Writes
        land in order, one at a time; one asked for while another is under way
        replaces any still waiting (only the newest state matters). The next
        call that needs the record written waits for them (:meth:`_lock`). A
        crash before they land leaves a state before, which :meth:`adopt`
        replaces with what it observes."""
        machine_id = record.spec.machine_id
        self._unwritten[machine_id] = record
        if machine_id not in self._writing:
            self._writing[machine_id] = asyncio.ensure_future(self._write_out(machine_id))

    async def _write_out(self, machine_id: str) -> None:
        try:
            while (record := self._unwritten.pop(machine_id, None)) is not None:
                try:
                    await asyncio.to_thread(self._save, record)
                except OSError as e:  # the record says a state before; adopt observes anew
                    self.log.warning(
                        "machine %s: its record could not be written: %s", machine_id, e
                    )
        finally:
            del self._writing[machine_id]

    async def _writes_done(self) -> None:
        """Wait for every record write under way (closing)."""
        for machine_id in list(self._writing):
            await self._written(machine_id)

    async def create(self, spec: MachineSpec) -> None:
        async with self._lock(spec.machine_id):
            paths = self._paths(spec.machine_id)
            if records.read(paths.home) is not None:
                return  # created already (a retry): the first spec stands
            paths.home.mkdir(parents=True, exist_ok=True)
            record = records.MachineRecord(spec, MachineState.STOPPED, self.recipe.key())
            # The record (the machine exists) only once its disk does; written in the
            # disk's thread, its fsync off the loop.
            await storage.make_disk(
                paths.disk_image,
                spec.limits.disk_bytes,
                self.layout.data_dir / "disks",
                then=lambda: self._save(record),
            )

    async def start(self, machine_id: str) -> None:
        async with self._lock(machine_id):
            record = self._record(machine_id)
            observed = await self._observe(machine_id)
            if observed is MachineState.RUNNING:
                return
            if observed is MachineState.SUSPENDED:
                await self._thaw(machine_id)
                self._save_soon(record.with_state(MachineState.RUNNING))
                return
            await self.prepare()
            started = time.perf_counter()
            await self.release(machine_id)  # whatever a dead incarnation left
            # Recorded while the machine boots: the write's fsync (tens of ms on a
            # busy disk) then neither holds up the answer nor blocks the loop. A
            # start that fails records the state it found again.
            saving = asyncio.ensure_future(
                asyncio.to_thread(self._save, record.with_state(MachineState.RUNNING))
            )
            try:
                await self._boot(record)
            except BaseException as e:
                self.log.warning("machine %s failed to start: %s", machine_id, e)
                await asyncio.gather(saving, return_exceptions=True)
                await self.release(machine_id)
                with contextlib.suppress(OSError):  # the start's own error says more
                    self._save(record)
                raise
            await saving
            self.log.info(
                "machine %s started in %.0f ms", machine_id, (time.perf_counter() - started) * 1000
            )

    async def set_egress(self, machine_id: str, egress: EgressPolicy) -> None:
        """Change the machine's egress policy: recorded first (every later start
        loads it), then, while its network exists, swapped into its rules at once
        (in force when this returns)."""
        async with self._lock(machine_id):
            record = self._record(machine_id)
            spec = dataclasses.replace(record.spec, egress=egress)
            await asyncio.to_thread(self._save, dataclasses.replace(record, spec=spec))
            if self.network.active(machine_id):
                await self.network.set_egress(machine_id, egress)

    async def egress_audit(self, machine_id: str) -> list[EgressDestination]:
        return await self.network.audit(machine_id)

    async def suspend(self, machine_id: str) -> None:
        await self._flip(machine_id, MachineState.RUNNING, MachineState.SUSPENDED)

    async def resume(self, machine_id: str) -> None:
        await self._flip(machine_id, MachineState.SUSPENDED, MachineState.RUNNING)

    async def _flip(self, machine_id: str, source: MachineState, target: MachineState) -> None:
        """``source`` → ``target`` (freeze or thaw); already ``target`` is done."""
        async with self._lock(machine_id, written=False):
            # Maybe not the newest record while a write is under way: its spec is.
            record = self._record(machine_id)
            observed = await self._observe(machine_id)
            if observed is target:
                return
            if observed is not source:
                raise DriverError(f"machine {machine_id} is {observed.value}, not {source.value}")
            await (self._freeze if target is MachineState.SUSPENDED else self._thaw)(machine_id)
            self._save_soon(record.with_state(target))

    async def _release_stopped(self, machine_id: str) -> None:
        """For work on a stopped machine's disk (under the machine's lock): it
        exists, is stopped, and nothing of an old incarnation holds its files."""
        self._record(machine_id)
        observed = await self._observe(machine_id)
        if observed is not MachineState.STOPPED:
            raise DriverError(
                f"machine {machine_id} is {observed.value}; stop it before exporting its layer"
            )
        await self.release(machine_id)

    async def state(self, machine_id: str) -> MachineState:
        try:
            self._record(machine_id)
        except MachineNotFound:
            return MachineState.ABSENT
        return await self._observe(machine_id)

    def agent_socket(self, machine_id: str) -> Path:
        return self._paths(machine_id).socket

    # -- moving a stopped machine to another node -------------------------------------
    async def export_disk(self, machine_id: str) -> AsyncGenerator[bytes, None]:
        """A stopped machine's record and disk as a stream (:mod:`.transfer`).
        The machine's lock is held until the stream ends, so it cannot start
        while its disk is read; the machine itself is left as it was."""
        async with self._lock(machine_id):
            await self._release_stopped(machine_id)
            record = self._record(machine_id)
            data = {
                "spec": records.spec_to_json(record.spec),
                "image": record.image,
            }
            stream = send(self._paths(machine_id).disk_image, data)
            try:
                async for chunk in stream:
                    yield chunk
            finally:
                await stream.aclose()

    async def import_disk(
        self,
        machine_id: str,
        chunks: AsyncIterator[bytes],
        *,
        layers: tuple[Path, ...],
        env: Mapping[str, str],
        room: Callable[[int], str | None] | None = None,
    ) -> Received:
        """Make ``machine_id`` here, stopped, from another node's
        :meth:`export_disk` stream. ``layers`` and ``env`` are this node's
        build of the machine's environment (a layer is a path on its node);
        ``room`` may refuse the disk by its size (:func:`.transfer.receive`).
        Nothing is left behind when the stream fails or arrives damaged; the
        machine appears whole (one rename) or not at all."""
        async with self._lock(machine_id):
            paths = self._paths(machine_id)
            if paths.home.exists():
                raise DriverError(f"machine {machine_id} exists here already")
            self.machines.mkdir(parents=True, exist_ok=True)
            # No record inside until it is whole: gc and adopt pass it by.
            incoming = self.machines / f"{INCOMING_PREFIX}{machine_id}-{secrets.token_hex(4)}"
            incoming.mkdir()
            try:
                raw, received = await receive(chunks, incoming / paths.disk_image.name, room)
                spec = records.spec_from_json(raw["spec"])
                if spec.machine_id != machine_id:
                    raise DriverError(f"the stream holds machine {spec.machine_id}")
                spec = dataclasses.replace(spec, layers=tuple(layers), env=dict(env))
                image = str(raw.get("image") or "")
                self._imported(incoming)
                records.write(incoming, records.MachineRecord(spec, MachineState.STOPPED, image))
                os.rename(incoming, paths.home)
            except BaseException:
                with contextlib.suppress(OSError):
                    await asyncio.to_thread(storage.remove_tree, incoming)
                raise
            self.log.info(
                "machine %s imported: %d bytes, sha256 %s",
                machine_id,
                received.bytes,
                received.sha256,
            )
            return received

    # -- copying a machine into new ones (fork) ----------------------------------------
    async def fork(self, source_id: str, copies: Sequence[ForkCopy]) -> float:
        """Make each of ``copies`` here, stopped, with the files ``source_id``
        holds now (:class:`~.base.ForkingDriver`). A running source is held
        still (:meth:`_hold_still`) while its disk is copied once, and runs on
        after (further copies are made from the first); a suspended one stays
        suspended. The seconds it was held are returned. Each copy appears
        whole (one rename) or not at all; on failure none is left."""
        for copy in copies:
            check_machine_id(copy.machine_id)
            if self._paths(copy.machine_id).home.exists():
                raise DriverError(f"machine {copy.machine_id} exists here already")
        self.machines.mkdir(parents=True, exist_ok=True)
        made: list[Path] = []
        async with self._lock(source_id):
            record = self._record(source_id)
            incoming = [
                self.machines / f"{INCOMING_PREFIX}{copy.machine_id}-{secrets.token_hex(4)}"
                for copy in copies
            ]
            try:
                for home in incoming:
                    home.mkdir()
                    made.append(home)
                disk = self._paths(source_id).disk_image
                held = await self._copy_disk(source_id, disk, [h / disk.name for h in incoming])
                for copy, home in zip(copies, incoming, strict=True):
                    spec = dataclasses.replace(
                        record.spec,
                        machine_id=copy.machine_id,
                        hostname=copy.hostname,
                        labels=dict(copy.labels),
                        named_later=False,
                    )
                    self._imported(home)
                    self._restore_memory_hook(source_id, home)
                    records.write(
                        home, records.MachineRecord(spec, MachineState.STOPPED, record.image)
                    )
                for copy, home in zip(copies, incoming, strict=True):
                    target = self._paths(copy.machine_id).home
                    os.rename(home, target)
                    made[made.index(home)] = target
            except BaseException:
                for path in made:
                    with contextlib.suppress(OSError):
                        await asyncio.to_thread(storage.remove_tree, path)
                raise
        self.log.info(
            "machine %s forked into %s; held still %.1f ms",
            source_id,
            ", ".join(copy.machine_id for copy in copies),
            held * 1000,
        )
        return held

    async def _copy_disk(self, source_id: str, disk: Path, targets: list[Path]) -> float:
        """``disk`` copied to each of ``targets``; the seconds the source was held.
        A live source is held for one copy only: the others are made from that
        one once it runs again."""
        first, rest = targets[0], targets[1:]

        def copy_rest() -> None:
            for target in rest:
                storage.sparse_copy(first, target)

        observed = await self._observe(source_id)
        if observed is MachineState.STOPPED:
            await self.release(source_id)  # whatever a dead incarnation left
            await asyncio.to_thread(storage.sparse_copy, disk, first)
            await asyncio.to_thread(copy_rest)
            return 0.0
        started = time.perf_counter()
        await self._hold_still(source_id, observed)
        try:
            # Not synced while the source is held: the copy's fsync comes after.
            await asyncio.to_thread(storage.sparse_copy, disk, first, sync=False)
        finally:
            await self._let_go(source_id, observed)
        held = time.perf_counter() - started
        await asyncio.to_thread(storage.sync_file, first)
        await asyncio.to_thread(copy_rest)
        return held

    async def _hold_still(self, machine_id: str, observed: MachineState) -> None:
        """Halt a live machine and bring what it wrote into its disk file."""
        if observed is MachineState.RUNNING:
            await self._freeze(machine_id)

    async def _let_go(self, machine_id: str, observed: MachineState) -> None:
        """Undo :meth:`_hold_still`: the machine is as it was (``observed``)."""
        if observed is MachineState.RUNNING:
            await self._thaw(machine_id)

    def _restore_memory_hook(self, source_id: str, home: Path) -> None:
        """Where a checkpointed source's memory image will be copied into the
        new machine ``home`` for its start to restore (issue 27: processes
        follow files once a class checkpoints to disk). Nothing yet: a copy
        starts with the source's files and fresh processes."""
        return None

    def _imported(self, home: Path) -> None:
        """What a driver keeps beside a received machine's disk, written into its
        directory ``home`` before the machine appears there whole (one rename);
        nothing by default."""
        return None

    async def _adopt_records(self) -> list[ObservedMachine]:
        """Every machine with a record, as it is now: a dead incarnation (or a
        live one whose network is gone) is released to ``stopped``, a live one is
        handed to :meth:`_adopt_live`; the record follows what was observed."""
        found: list[ObservedMachine] = []
        try:
            homes = sorted(p for p in self.machines.iterdir() if p.is_dir())
        except FileNotFoundError:
            homes = []
        for home in homes:
            listed = records.read(home)
            if listed is None:
                continue  # a create that never finished: gc removes it
            machine_id = listed.spec.machine_id
            async with self._lock(machine_id):
                # Read again under the lock: a destroy that held it meanwhile
                # removed the machine (whose files the steps below would miss).
                record = records.read(home)
                if record is None:
                    continue
                observed = await self._observe(machine_id)
                if observed is not MachineState.STOPPED and not await self._adopt_network(
                    machine_id
                ):
                    observed = MachineState.STOPPED
                if observed is MachineState.STOPPED:
                    await self.release(machine_id)
                else:
                    await self._adopt_live(machine_id)
                if observed.value != record.commanded.value:
                    self._save(record.with_state(observed))
            found.append(
                ObservedMachine(
                    machine_id=machine_id, state=observed, labels=dict(record.spec.labels)
                )
            )
        return found

    async def _adopt_live(self, machine_id: str) -> None:  # noqa: B027 - an optional hook
        """Reconnect what a live machine needs beyond its network (nothing here)."""

    async def _adopt_network(self, machine_id: str) -> bool:
        """Reload a live machine's network rules and restart its slirp if it died;
        ``False`` (the machine must be stopped) when its namespace is gone."""
        try:
            if await self.network.adopt(machine_id) is not None:
                return True
        except DriverError as e:
            self.log.warning("machine %s: %s", machine_id, e)
        self.log.warning("machine %s lost its network; stopping it", machine_id)
        return False

    def machine_ids(self) -> list[str]:
        try:
            return sorted(p.name for p in self.machines.iterdir() if (p / records.RECORD).exists())
        except FileNotFoundError:
            return []

    def machine_records(self) -> list[records.MachineRecord]:
        """Every machine's record (those that vanish while being read are left out)."""
        found = (records.read(self.machines / machine_id) for machine_id in self.machine_ids())
        return [record for record in found if record is not None]

    def images_in_use(self) -> set[str]:
        """The base images this driver's machines stand on (``podbay gc`` keeps them)."""
        return {record.image for record in self.machine_records() if record.image}


class Collectable(Protocol):
    """What ``podbay gc`` asks of every class's driver first."""

    async def adopt(self) -> list[ObservedMachine]: ...

    async def destroy(self, machine_id: str) -> None: ...

    def machine_ids(self) -> list[str]: ...


#: A disk being received from another node (:meth:`import_disk`) lives under
#: this name until it is whole; a node killed meanwhile leaves it behind.
INCOMING_PREFIX = ".incoming-"
#: ``podbay gc`` removes such a leftover once nothing has written to it for this
#: long (a live transfer writes all the time); ``gc --all`` removes it at once.
STALE_INCOMING_SECONDS = 600.0


async def adopt_for_gc(driver: Collectable, *, everything: bool) -> tuple[list[str], set[str]]:
    """``podbay gc``'s first step, whatever the class: adopt what runs and,
    with ``everything``, destroy it all. The lines to report, and the ids of
    the machines that still have a record."""
    done: list[str] = []
    observed = await driver.adopt()
    if everything:
        for machine in observed:
            await driver.destroy(machine.machine_id)
            done.append(f"destroyed machine {machine.machine_id}")
    return done, set(driver.machine_ids())


def uts_name(hostname: str) -> str:
    """What the kernel accepts as a hostname: at most 64 bytes, whole characters."""
    return hostname.encode()[:64].decode(errors="ignore") or "sandbox"


def hosts_file(hostname: str) -> str:
    """The sandbox's ``/etc/hosts``: loopback names and its own hostname."""
    return (
        f"127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n127.0.1.1\t{hostname}\n"
    )
