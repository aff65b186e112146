"""A vm template build is an optimisation, so its failures are logged and
forgotten, but cancelling it (the driver closing, the node stopping) must
still cancel it: a build that swallowed its cancellation would run on."""

from __future__ import annotations

import asyncio
import concurrent.futures
from pathlib import Path
from typing import Any

import pytest

from podbay.host import storage
from podbay.runtime.vm import templates
from podbay.runtime.vm.driver import VmDriver
from podbay.settings import Settings

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def blocked_build(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[VmDriver, asyncio.Event]:
    """A driver whose template build waits forever where it makes the disk;
    the event is set once the build got there."""
    vm = VmDriver(Settings.load(environ={}, data_dir=tmp_path))
    reached = asyncio.Event()

    async def make_disk(*args: Any, **kwargs: Any) -> None:
        reached.set()
        await asyncio.Event().wait()

    async def no_network(machine_id: str) -> None:
        return None

    monkeypatch.setattr(storage, "make_disk", make_disk)
    monkeypatch.setattr(vm.network, "teardown", no_network)
    monkeypatch.setattr(vm.cgroups, "remove", lambda path: False)
    return vm, reached


SHAPE = templates.Shape(memory_mib=256, cpus=1, disk_bytes=1 << 30, network=False)


async def test_a_cancelled_template_build_is_cancelled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    vm, reached = blocked_build(tmp_path, monkeypatch)
    build = asyncio.create_task(vm.template_builder.build("0" * 24, SHAPE, []))
    await reached.wait()
    build.cancel()
    with pytest.raises(asyncio.CancelledError):
        await build
    assert build.cancelled()
    assert not (vm.home / "templates").exists() or not any((vm.home / "templates").iterdir())


async def test_a_failed_template_build_is_logged_not_raised(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    vm, _ = blocked_build(tmp_path, monkeypatch)

    async def broken_disk(*args: Any, **kwargs: Any) -> None:
        raise OSError("no room")

    monkeypatch.setattr(storage, "make_disk", broken_disk)
    await vm.template_builder.build("1" * 24, SHAPE, [])
    assert "not built: no room" in caplog.text


async def test_closing_while_a_build_runs_on_can_itself_be_cancelled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A build that does not end when cancelled (its guest still being killed)
    keeps close() waiting; cancelling close() then must cancel it, not be eaten."""
    vm, _ = blocked_build(tmp_path, monkeypatch)
    stuck: concurrent.futures.Future[None] = concurrent.futures.Future()
    stuck.set_running_or_notify_cancel()  # running: cancel() cannot end it
    vm.template_builder._builds.append(stuck)
    waiting = asyncio.create_task(vm.template_builder.cancel())
    await asyncio.sleep(0)  # it waits on the build now
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    stuck.set_result(None)
