"""Move a large request body from the client's socket to the agent's in the kernel.

Through uvicorn and asyncio streams, every byte of an upload is copied four
times in the gateway (socket to uvicorn's buffer, to the parser's bytes, to
the request's bytearray, to the body message) and handed over in 64 KiB
steps, costing the server as much CPU as the agent's SHA-256 of the same
bytes. ``splice(2)`` through a pipe moves them by reference (TCP to pipe,
pipe to the agent's unix socket) for a tenth of that (docs/performance.md).

The loop runs in a thread of its own (both sockets stay non-blocking and are
polled), so the event loop never waits on it, and the relay waits for the
thread to be gone before either socket can be closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import select
import threading
from enum import Enum

#: How much one splice moves at most (the pipe is grown to this where allowed).
PIPE_SIZE = 1024 * 1024
#: Bodies spliced at once, each by a thread; more go through the event loop as
#: any body does (slow clients declaring large bodies must not cost a thread each).
MAX_AT_ONCE = 16
_running = 0


def available() -> bool:
    """Whether another body may be spliced now (checked before taking it over)."""
    return _running < MAX_AT_ONCE


_FLAGS = os.SPLICE_F_MOVE | os.SPLICE_F_NONBLOCK


class Outcome(Enum):
    DONE = "done"
    #: The client closed, failed or left the body idle past the timeout.
    CLIENT_GONE = "client gone"
    #: The agent stopped taking the body (it may have answered already); the
    #: rest of the body was read and dropped, so that the client, still
    #: sending, is not reset before it reads that answer.
    AGENT_GONE = "agent gone"
    STOPPED = "stopped"


def splice_body(
    src: int, dst: int, left: int, idle_timeout: float, stop: int, head: bytes = b""
) -> Outcome:
    """Send ``head`` (body bytes already read), then move exactly ``left`` bytes
    from socket ``src`` to socket ``dst`` (both non-blocking; ``dst`` -1: the
    agent is gone already); returns early when ``stop`` (a pipe's read end)
    turns readable."""
    r, w = os.pipe2(os.O_CLOEXEC)
    sink = -1
    try:
        if dst < 0:
            sink = dst = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
        out = memoryview(head)
        while out:
            try:
                out = out[os.write(dst, out) :]
            except BlockingIOError:
                ready = dict(_poll({stop: select.POLLIN, dst: select.POLLOUT}, idle_timeout))
                if not ready:
                    return Outcome.CLIENT_GONE
                if stop in ready:
                    return Outcome.STOPPED
            except OSError:
                if sink >= 0:
                    raise
                sink = dst = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
        with contextlib.suppress(OSError):  # a smaller pipe only means more steps
            fcntl.fcntl(w, fcntl.F_SETPIPE_SZ, PIPE_SIZE)
        room = fcntl.fcntl(w, fcntl.F_GETPIPE_SZ)
        held = 0  # bytes in the pipe
        # Each side is tried until it would block, then polled for: a would-block
        # is an exception in Python, and retrying it blindly cost more CPU than
        # the splices themselves.
        readable = writable = True
        while left or held:
            if readable and left and held < room:
                try:
                    n = os.splice(src, w, min(left, room - held), flags=_FLAGS)
                except BlockingIOError:
                    readable = False
                except OSError:
                    return Outcome.CLIENT_GONE
                else:
                    if not n:
                        return Outcome.CLIENT_GONE
                    left -= n
                    held += n
            if writable and held:
                try:
                    held -= os.splice(r, dst, held, flags=_FLAGS)
                except BlockingIOError:
                    writable = False
                except OSError:
                    if sink >= 0:
                        raise
                    sink = dst = os.open(os.devnull, os.O_WRONLY | os.O_CLOEXEC)
                    continue
            want_in = left > 0 and held < room
            if not (left or held) or (readable and want_in) or (writable and held):
                continue
            wanted = {stop: select.POLLIN}
            if want_in:
                wanted[src] = select.POLLIN
            if held:
                wanted[dst] = select.POLLOUT
            ready = dict(_poll(wanted, idle_timeout))
            if not ready:
                return Outcome.CLIENT_GONE
            if stop in ready:
                return Outcome.STOPPED
            readable = readable or src in ready
            writable = writable or dst in ready
        return Outcome.DONE if sink < 0 else Outcome.AGENT_GONE
    finally:
        os.close(r)
        os.close(w)
        if sink >= 0:
            os.close(sink)


def _poll(wanted: dict[int, int], timeout: float) -> list[tuple[int, int]]:
    poller = select.poll()
    for fd, events in wanted.items():
        poller.register(fd, events)
    return poller.poll(timeout * 1000)


async def splice_in_thread(
    src: int, dst: int, left: int, idle_timeout: float, head: bytes = b""
) -> Outcome:
    """:func:`splice_body` in a thread of its own; cancelling stops the thread and
    waits for it, so neither socket is closed under it."""
    global _running
    loop = asyncio.get_running_loop()
    done: asyncio.Future[Outcome] = loop.create_future()
    stop_r, stop_w = os.pipe2(os.O_CLOEXEC)
    _running += 1

    def settle(outcome: Outcome | None, exc: BaseException | None) -> None:
        if not done.done():
            if exc is not None:
                done.set_exception(exc)
            else:
                done.set_result(outcome or Outcome.STOPPED)

    def run() -> None:
        try:
            outcome = splice_body(src, dst, left, idle_timeout, stop_r, head)
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting relay, which raises it
            loop.call_soon_threadsafe(settle, None, exc)
        else:
            loop.call_soon_threadsafe(settle, outcome, None)

    try:
        threading.Thread(target=run, name="podbay-splice", daemon=True).start()
        try:
            return await asyncio.shield(done)
        except asyncio.CancelledError:
            os.write(stop_w, b"x")
            while not done.done():
                with contextlib.suppress(asyncio.CancelledError):
                    await asyncio.shield(done)
            raise
    finally:
        _running -= 1
        os.close(stop_r)
        os.close(stop_w)
