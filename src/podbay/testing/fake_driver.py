"""Test-only doubles for the platform's unit tests: a driver whose machines
are tiny HTTP echo servers on unix sockets, and a clock tests move by hand.
Never a real driver: it keeps the :class:`~podbay.runtime.base.Driver`
contract (checked by ``tests/unit/testing/test_fake_driver_conformance.py``
against :class:`~podbay.testing.driver_conformance.DriverContract`) so what the
control plane's tests learn from it holds for the real drivers."""

from __future__ import annotations

import asyncio
import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

from podbay.domain.egress import EgressDestination, EgressPolicy
from podbay.runtime.base import (
    Capabilities,
    DriverError,
    MachineSpec,
    MachineState,
    ObservedMachine,
)


class Clock:
    def __init__(self) -> None:
        self.now = datetime(2026, 1, 1, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


async def _echo(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    seen: list[tuple[str, str]] | None = None,
    open_: set[asyncio.StreamWriter] | None = None,
) -> None:
    """Answer every request with what it was: method, path, headers, body size.
    Connections are counted in ``seen`` as ("CONNECT", ""), requests as (method, path);
    open ones are kept in ``open_`` (a machine that dies closes them)."""
    if seen is not None:
        seen.append(("CONNECT", ""))
    if open_ is not None:
        open_.add(writer)
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            method, target, _ = lines[0].split(" ", 2)
            if seen is not None:
                seen.append((method, target))
            headers: dict[str, str] = {}
            for line in lines[1:]:
                if ":" in line:
                    k, v = line.split(":", 1)
                    headers[k.strip().lower()] = v.strip()
            size = 0
            if "content-length" in headers:
                remaining = int(headers["content-length"])
                while remaining:
                    chunk = await reader.read(min(remaining, 65536))
                    if not chunk:
                        return
                    size += len(chunk)
                    remaining -= len(chunk)
            elif headers.get("transfer-encoding") == "chunked":
                while True:
                    n = int((await reader.readuntil(b"\r\n")).strip(), 16)
                    if n == 0:
                        await reader.readuntil(b"\r\n")
                        break
                    size += len(await reader.readexactly(n))
                    await reader.readexactly(2)
            body = json.dumps(
                {"method": method, "path": target, "headers": headers, "size": size}
            ).encode()
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                b"content-length: " + str(len(body)).encode() + b"\r\n\r\n" + body
            )
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        if open_ is not None:
            open_.discard(writer)
        writer.close()


@dataclass
class FakeMachine:
    spec: MachineSpec
    state: MachineState = MachineState.STOPPED
    server: asyncio.AbstractServer | None = None
    labels: dict[str, str] = field(default_factory=dict)
    #: What reached its agent socket: ("CONNECT", "") per connection, (method, path).
    requests: list[tuple[str, str]] = field(default_factory=list)
    starts: int = 0
    #: Its agent's open connections.
    connections: set[asyncio.StreamWriter] = field(default_factory=set)


class FakeDriver:
    name = "fake"
    base_image = "fake-base"

    def __init__(self, root: Path, *, suspend: bool = True) -> None:
        self.root = root
        self.capabilities = Capabilities(suspend=suspend, stop_keeps_files=True, network=False)
        self.machines: dict[str, FakeMachine] = {}
        self.fail_start: Exception | None = None
        self.start_delay = 0.0
        self.calls: list[tuple[str, str]] = []
        self.prepared = False
        #: What egress_audit answers, per machine id (the fake sends nothing).
        self.audits: dict[str, list[EgressDestination]] = {}

    async def prepare(self) -> None:
        self.prepared = True

    async def create(self, spec: MachineSpec) -> None:
        self.calls.append(("create", spec.machine_id))
        if spec.machine_id not in self.machines:
            self.machines[spec.machine_id] = FakeMachine(spec, labels=dict(spec.labels))

    def _get(self, machine_id: str) -> FakeMachine:
        try:
            return self.machines[machine_id]
        except KeyError:
            raise DriverError(f"no machine {machine_id}") from None

    async def start(self, machine_id: str) -> None:
        self.calls.append(("start", machine_id))
        m = self._get(machine_id)
        if self.start_delay:
            await asyncio.sleep(self.start_delay)
        if self.fail_start is not None:
            raise self.fail_start
        if m.state is MachineState.RUNNING:
            return
        path = self.agent_socket(machine_id)
        path.unlink(missing_ok=True)
        if m.server is not None:  # a suspended machine's: replaced, not leaked
            m.server.close()
        m.server = await asyncio.start_unix_server(
            functools.partial(_echo, seen=m.requests, open_=m.connections), path=str(path)
        )
        m.state = MachineState.RUNNING
        m.starts += 1

    async def suspend(self, machine_id: str) -> None:
        self.calls.append(("suspend", machine_id))
        self._flip(machine_id, MachineState.RUNNING, MachineState.SUSPENDED)

    async def resume(self, machine_id: str) -> None:
        self.calls.append(("resume", machine_id))
        self._flip(machine_id, MachineState.SUSPENDED, MachineState.RUNNING)

    def _flip(self, machine_id: str, source: MachineState, target: MachineState) -> None:
        """As the real drivers do: ``source`` to ``target``, already ``target`` is
        done, anything else (a stopped machine has nothing to freeze) refused."""
        m = self._get(machine_id)
        if m.state is not target and m.state is not source:
            raise DriverError(f"machine {machine_id} is {m.state.value}, not {source.value}")
        m.state = target

    async def _close(self, m: FakeMachine) -> None:
        if m.server is not None:
            m.server.close()
            m.server = None
        for writer in list(m.connections):  # its agent is gone: so are its connections
            writer.close()

    async def stop(self, machine_id: str) -> None:
        self.calls.append(("stop", machine_id))
        m = self._get(machine_id)
        await self._close(m)
        m.state = MachineState.STOPPED

    async def destroy(self, machine_id: str) -> None:
        self.calls.append(("destroy", machine_id))
        m = self.machines.pop(machine_id, None)
        if m is not None:
            await self._close(m)

    async def assign(self, machine_id: str, *, hostname: str, labels: Mapping[str, str]) -> None:
        self.calls.append(("assign", machine_id))
        self._get(machine_id).labels = dict(labels)

    async def set_egress(self, machine_id: str, egress: EgressPolicy) -> None:
        self.calls.append(("set_egress", machine_id))
        m = self._get(machine_id)
        m.spec = replace(m.spec, egress=egress)

    async def egress_audit(self, machine_id: str) -> list[EgressDestination]:
        self.calls.append(("egress_audit", machine_id))
        self._get(machine_id)
        return list(self.audits.get(machine_id, []))

    async def state(self, machine_id: str) -> MachineState:
        m = self.machines.get(machine_id)
        return m.state if m else MachineState.ABSENT

    def agent_socket(self, machine_id: str) -> Path:
        return self.root / f"{machine_id}.sock"

    async def adopt(self) -> list[ObservedMachine]:
        return [
            ObservedMachine(machine_id=k, state=m.state, labels=dict(m.labels))
            for k, m in self.machines.items()
        ]

    async def export_layer(self, machine_id: str, dest: Path) -> None:
        raise DriverError("not supported")

    async def close(self) -> None:
        pass

    async def close_all(self) -> None:
        for m in self.machines.values():
            await self._close(m)

    def running(self) -> list[str]:
        return [k for k, m in self.machines.items() if m.state is MachineState.RUNNING]
