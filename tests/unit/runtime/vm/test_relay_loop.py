"""The vm driver's relay loop (a thread of its own) leaves no loop unclosed."""

from __future__ import annotations

import asyncio
import threading

import pytest

from podbay.runtime.vm.relay import RelayLoop


def test_a_stopped_relay_loop_is_closed_by_its_thread() -> None:
    relays = RelayLoop()
    loop = relays._ensure()
    thread = relays._thread
    assert thread is not None
    assert asyncio.run_coroutine_threadsafe(asyncio.sleep(0, 7), loop).result(5) == 7
    relays.stop()
    assert not thread.is_alive()
    assert loop.is_closed()


def test_a_stop_that_outwaits_its_thread_still_leaves_the_loop_closed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    relays = RelayLoop()
    loop = relays._ensure()
    thread = relays._thread
    assert thread is not None
    release = threading.Event()
    loop.call_soon_threadsafe(release.wait)  # the loop busy past stop's wait
    # stop's wait for the thread runs out at once, as on a loaded host.
    monkeypatch.setattr(thread, "join", lambda timeout=None: None)
    relays.stop()
    assert not loop.is_closed()  # still running its last callback
    release.set()
    threading.Thread.join(thread, 10)
    assert loop.is_closed()
