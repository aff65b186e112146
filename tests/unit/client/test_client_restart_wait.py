"""How long attach waits on refused connections: briefly for a server this
client has never reached, long enough to ride over a restart of one it has."""

from __future__ import annotations

from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import anyio
import httpx
import pytest
from fakeplatform import Fake

import podbay.client._async.client as async_module
import podbay.client._sync.client as sync_module
from podbay.client import AsyncSandboxClient, SandboxClient
from podbay.client._core import FIRST_CONTACT_WAIT_SECONDS, RESTART_WAIT_SECONDS
from podbay.errors import SandboxRequestError, SandboxUnavailableError


class Clock:
    """Fake time: sleeping advances it instantly, so the test waits for nothing."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.slept = 0.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        self.slept += seconds

    async def asleep(self, seconds: float) -> None:
        self.sleep(seconds)


class Attacher:
    """``attach(name)`` on one client of either face, sleeping on ``clock``."""

    def __init__(self, face: str, fake: Fake, monkeypatch: pytest.MonkeyPatch) -> None:
        self.clock = Clock()
        fake_time = SimpleNamespace(monotonic=self.clock.monotonic, time=self.clock.monotonic)
        transport = httpx.MockTransport(fake)
        self.sync: SandboxClient | None = None
        self.aio: AsyncSandboxClient | None = None
        if face == "sync":
            monkeypatch.setattr(sync_module, "time", fake_time)
            monkeypatch.setattr(sync_module, "sleep", self.clock.sleep)
            self.sync = SandboxClient(identity_token=fake.token, transport=transport)
        else:
            monkeypatch.setattr(async_module, "time", fake_time)
            monkeypatch.setattr(async_module, "sleep", self.clock.asleep)
            self.aio = AsyncSandboxClient(identity_token=fake.token, transport=transport)

    def __call__(self, name: str) -> Any:
        if self.sync is not None:
            return self.sync.attach(name)
        assert self.aio is not None
        return anyio.run(self.aio.attach, name)

    def close(self) -> None:
        if self.sync is not None:
            self.sync.close()
        if self.aio is not None:
            anyio.run(self.aio.aclose)


@pytest.fixture(params=["sync", "async"])
def attach(
    request: pytest.FixtureRequest, fake: Fake, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Attacher]:
    attacher = Attacher(str(request.param), fake, monkeypatch)
    yield attacher
    attacher.close()


def test_a_server_never_reached_is_unavailable_after_a_short_wait(
    attach: Attacher, fake: Fake
) -> None:
    fake.refuse_control = 10**6
    with pytest.raises(SandboxUnavailableError):
        attach("t")
    assert attach.clock.slept <= FIRST_CONTACT_WAIT_SECONDS + 1.0
    assert attach.clock.slept >= FIRST_CONTACT_WAIT_SECONDS - 1.0  # it did wait, briefly


def test_a_server_that_answered_before_is_waited_for_through_a_restart(
    attach: Attacher, fake: Fake
) -> None:
    attach("t")
    # Refused for longer than a first contact may wait, shorter than a restart.
    fake.refuse_control = int(FIRST_CONTACT_WAIT_SECONDS * 4)  # pauses grow to 1 s each
    handle = attach("u")
    assert handle.state == "running"
    assert FIRST_CONTACT_WAIT_SECONDS < attach.clock.slept < RESTART_WAIT_SECONDS
    assert fake.refuse_control == 0


def test_a_class_still_being_checked_is_waited_for_as_retry_after_says(
    attach: Attacher, fake: Fake
) -> None:
    """A server checking the class asked for answers 503 with Retry-After for
    tens of seconds: attach waits what it says, past the restart wait, even
    on the client's first contact."""
    fake.checking = 20  # 40 s of "Retry-After: 2"
    handle = attach("t")
    assert handle.state == "running"
    assert fake.checking == 0
    assert attach.clock.slept == 40.0 > RESTART_WAIT_SECONDS


def test_a_503_without_retry_after_is_an_error_at_once(attach: Attacher, fake: Fake) -> None:
    fake.checking, fake.checking_retry_after = 1, None
    with pytest.raises(SandboxRequestError) as refused:
        attach("t")
    assert refused.value.code == "SANDBOXES_UNAVAILABLE"
    assert attach.clock.slept == 0
