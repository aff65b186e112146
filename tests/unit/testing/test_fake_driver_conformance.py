"""The unit tests' fake driver against the Driver contract the real drivers
pass (:class:`DriverContract`): what the control plane's tests learn from the
fake holds for them."""

from __future__ import annotations

import asyncio
import socket
import threading
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from podbay.settings import Settings
from podbay.testing.driver_conformance import DriverContract, Harness
from podbay.testing.fake_driver import FakeDriver

T = TypeVar("T")


class LoopThread:
    """An event loop in a thread: the fake's machines are servers on it, and
    the suite talks to them synchronously from the test's thread."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        self.loop.close()


def http_ok(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX) as sock:
        sock.settimeout(10)
        sock.connect(str(path))
        sock.sendall(b"GET /info HTTP/1.1\r\nhost: agent\r\ncontent-length: 0\r\n\r\n")
        return sock.recv(4096).startswith(b"HTTP/1.1 200 ")


@pytest.fixture(params=[True, False], ids=["suspend", "no-suspend"])
def fake(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[FakeDriver, LoopThread]]:
    loop = LoopThread()
    driver = FakeDriver(tmp_path, suspend=request.param)
    yield driver, loop
    loop.run(driver.close_all())
    loop.close()


class TestFakeDriverContract(DriverContract):
    @pytest.fixture
    def conformance(self, fake: tuple[FakeDriver, LoopThread], tmp_path: Path) -> Harness:
        driver, loop = fake
        return Harness(
            driver,
            loop.run,
            Settings(data_dir=tmp_path),
            factory="podbay.testing.fake_driver:FakeDriver",
            probe=lambda machine_id: http_ok(driver.agent_socket(machine_id)),
        )
