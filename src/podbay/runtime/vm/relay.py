"""The host end of a machine's agent channel: a unix socket the gateway connects
to, each connection framed as a stream over QEMU's virtio-serial chardev.

The relay lives in the node process. QEMU is the chardev's server, so a node
restarted after ``kill -9`` just connects again: the guest sees the port
close, drops its streams, and answers the new hello. See ``guest/frames.py``
for the protocol and its flow control.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import secrets
import select
import threading
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

from ..base import DriverError
from .guest import frames as f

log = logging.getLogger("podbay.runtime.vm")

T = TypeVar("T")

#: How long to wait for the guest to answer a hello before trying a new
#: connection (a hello swallowed by a frame cut in half is then resent).
HELLO_RETRY_SECONDS = 5.0
#: How long a connection waits for the channel to QEMU before it is refused.
LINK_WAIT_SECONDS = 30.0


class _Stream:
    def __init__(
        self, relay: Relay, sid: int, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        self.relay, self.sid, self.reader, self.writer = relay, sid, reader, writer
        self.credit = f.WINDOW
        self.credit_changed = asyncio.Event()
        self.inbox: asyncio.Queue[bytes | int] = asyncio.Queue()
        self.closed = False

    async def run(self) -> None:
        self.relay.send(f.frame(f.OPEN, self.sid))
        up = asyncio.create_task(self._up())
        try:
            await self._down()
        finally:
            up.cancel()
            with contextlib.suppress(BaseException):
                await up
            self.writer.close()
            self.relay.streams.pop(self.sid, None)

    async def _up(self) -> None:
        """Client → guest, within the credit the guest grants."""
        try:
            while True:
                while self.credit <= 0:
                    self.credit_changed.clear()
                    await self.credit_changed.wait()
                data = await self.reader.read(min(self.credit, f.MAX_PAYLOAD))
                if not data:
                    if _hung_up(self.writer):
                        # Gone whole, not half-closed: the guest closes its end to
                        # the agent too, which then kills what this client ran
                        # (an EOF would read as a client still waiting for its answer).
                        self.abort()
                    else:
                        self.relay.send(f.frame(f.EOF, self.sid))
                    return
                self.credit -= len(data)
                self.relay.send(f.frame(f.DATA, self.sid, data))
                await self.relay.drain()
        except (OSError, ConnectionError):
            self.abort()

    async def _down(self) -> None:
        """Guest → client, returning credit as the client takes the bytes."""
        while True:
            item = await self.inbox.get()
            if isinstance(item, bytes):
                try:
                    self.writer.write(item)
                    await self.writer.drain()
                except (OSError, ConnectionError):
                    self.abort()
                    return
                self.relay.send(f.ack(self.sid, len(item)))
            elif item == f.EOF:
                with contextlib.suppress(OSError, ConnectionError):
                    if self.writer.can_write_eof():
                        self.writer.write_eof()
            else:
                return

    def grant(self, count: int) -> None:
        self.credit += count
        self.credit_changed.set()

    def abort(self) -> None:
        if not self.closed:
            self.closed = True
            self.relay.send(f.frame(f.CLOSE, self.sid))
            self.inbox.put_nowait(f.CLOSE)


def _hung_up(writer: asyncio.StreamWriter) -> bool:
    """True when the client closed its connection whole (a unix socket reports
    POLLHUP then; a peer that only shut down its writing side does not)."""
    sock = writer.get_extra_info("socket")
    if sock is None:
        return False
    poller = select.poll()
    poller.register(sock.fileno(), 0)
    return any(event & select.POLLHUP for _, event in poller.poll(0))


class Relay:
    """Serve ``listen_path``; carry its connections over the chardev at ``mux_path``."""

    def __init__(self, name: str, listen_path: Path, mux_path: Path, *, fresh: bool) -> None:
        self.name = name
        #: A guest just started answers its first hello once it has booted, however
        #: long that takes; an adopted one should answer at once.
        self.fresh = fresh
        self.listen_path = listen_path
        self.mux_path = mux_path
        self.streams: dict[int, _Stream] = {}
        self._next = secrets.randbelow(1 << 30) + 1
        self._server: asyncio.Server | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._link: asyncio.Task[None] | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._closing = False
        self._linked = asyncio.Event()
        self._syncs: dict[bytes, asyncio.Event] = {}
        #: Set when a template guest says it waits for its configuration.
        self.waiting = asyncio.Event()
        #: The guest answered this connection's hello (see :meth:`set_clock`).
        self._answered = False
        self._clock_due = False

    async def start(self) -> None:
        self.listen_path.unlink(missing_ok=True)
        self._server = await asyncio.start_unix_server(self._client, str(self.listen_path))
        os.chmod(self.listen_path, 0o660)
        self._link = asyncio.create_task(self._keep_linked())

    def send(self, data: bytes) -> None:
        if self._writer is not None and not self._writer.is_closing():
            self._writer.write(data)

    async def drain(self) -> None:
        if self._writer is not None and not self._writer.is_closing():
            with contextlib.suppress(OSError, ConnectionError):
                await self._writer.drain()

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._writer is None:
            # QEMU is starting (or the node just restarted): wait for the channel.
            try:
                async with asyncio.timeout(LINK_WAIT_SECONDS):
                    await self._linked.wait()
            except TimeoutError:
                writer.close()
                return
        sid = self._next
        self._next = (self._next % 0x7FFFFFFF) + 1
        stream = _Stream(self, sid, reader, writer)
        self.streams[sid] = stream
        await stream.run()

    async def _keep_linked(self) -> None:
        """Stay connected to QEMU's chardev; reconnect (with a new hello) when the
        guest does not answer, until QEMU is gone for good."""
        while not self._closing:
            try:
                reader, writer = await asyncio.open_unix_connection(str(self.mux_path))
            except OSError:
                await asyncio.sleep(0.05)
                if not self.mux_path.exists():
                    return
                continue
            nonce = secrets.token_bytes(f.NONCE_BYTES)
            writer.write(f.hello(f.HELLO, nonce))
            self._writer = writer
            self._linked.set()
            try:
                await self._serve(reader, nonce)
            except (OSError, ConnectionError, TimeoutError) as e:
                log.debug("machine %s: agent channel: %s", self.name, e)
            finally:
                self._writer = None
                self._answered = False
                self._linked.clear()
                writer.close()
                for stream in list(self.streams.values()):
                    stream.closed = True
                    stream.inbox.put_nowait(f.CLOSE)
            await asyncio.sleep(0.05)

    async def _serve(self, reader: asyncio.StreamReader, nonce: bytes) -> None:
        parser = f.Parser()
        answered = False
        loop = asyncio.get_running_loop()
        deadline = loop.time() + HELLO_RETRY_SECONDS
        while True:
            if answered or self.fresh:
                data = await reader.read(1 << 16)
            else:
                try:
                    async with asyncio.timeout_at(deadline):
                        data = await reader.read(1 << 16)
                except TimeoutError:
                    if await self._guest_paused():
                        deadline = loop.time() + HELLO_RETRY_SECONDS
                        continue
                    raise
            if not data:
                return
            parser.feed(data)
            for kind, sid, payload in parser.frames():
                if not answered:
                    answered = kind == f.HELLO_ACK and payload == nonce
                    self.fresh = self.fresh and not answered
                    self._answered = answered
                    if answered and self._clock_due:
                        self._clock_due = False
                        self.send(f.clock(time.time_ns()))
                    continue
                if kind == f.WAITING:
                    self.waiting.set()
                    continue
                if kind == f.SYNC_ACK:
                    done = self._syncs.pop(payload, None)
                    if done is not None:
                        done.set()
                    continue
                # Mirrors the guest's dispatch in guest/init.py (a deliberate twin:
                # there threads in the guest's interpreter, here asyncio queues).
                stream = self.streams.get(sid)
                if stream is None:
                    continue
                if kind == f.DATA:
                    stream.inbox.put_nowait(payload)
                elif kind == f.EOF:
                    stream.inbox.put_nowait(f.EOF)
                elif kind == f.ACK:
                    stream.grant(f.ack_count(payload))
                elif kind == f.CLOSE:
                    stream.closed = True
                    stream.inbox.put_nowait(f.CLOSE)

    async def _guest_paused(self) -> bool:
        """A suspended guest cannot answer: keep waiting rather than reconnecting."""
        from . import qmp

        try:
            status = await qmp.execute(
                self.mux_path.with_name("qmp.sock"), "query-status", within=2.0
            )
        except (OSError, TimeoutError, DriverError):
            return False
        return bool(status.get("status") != "running")

    async def sync(self, within: float) -> bool:
        """Have the guest write its dirty pages to its disks (before QEMU is
        killed); ``False`` when it did not answer within ``within`` seconds."""
        if not self._linked.is_set():
            return False
        nonce = secrets.token_bytes(f.NONCE_BYTES)
        done = self._syncs[nonce] = asyncio.Event()
        self.send(f.frame(f.SYNC, 0, nonce))
        try:
            async with asyncio.timeout(within):
                await done.wait()
        except TimeoutError:
            return False
        finally:
            self._syncs.pop(nonce, None)
        return True

    async def configure(self, config: bytes, within: float) -> None:
        """Give a guest restored from a template its machine's configuration."""
        async with asyncio.timeout(within):
            await self._linked.wait()
        self.send(f.frame(f.CONFIG, 0, config))
        await self.drain()

    async def set_clock(self) -> None:
        """Set the guest's wall clock to the host's. It stands still while QEMU
        is stopped, so every start of a stopped guest (a resume, a restore from a
        template or a checkpoint) calls this. Sent at once to a guest that
        answered this session's hello (it reads frames in order, before any
        later request); else as soon as it answers, its time taken then."""
        if self._answered:
            self.send(f.clock(time.time_ns()))
            await self.drain()
        else:
            self._clock_due = True

    async def set_hostname(self, name: str) -> None:
        self.send(f.frame(f.HOSTNAME, 0, name.encode()))
        await self.drain()

    async def close(self) -> None:
        self._closing = True
        if self._server is not None:
            self._server.close()
        if self._link is not None:
            self._link.cancel()
            with contextlib.suppress(BaseException):
                await self._link
        for stream in list(self.streams.values()):
            stream.closed = True
            stream.inbox.put_nowait(f.CLOSE)
        self.listen_path.unlink(missing_ok=True)


class RelayLoop:
    """One event loop, on its own thread, that serves every relay of a driver.

    The agent socket must answer whether or not the caller's loop is running:
    the driver's callers include synchronous code (``podbay doctor``, tests)
    that runs the loop only while awaiting a driver call, then talks to the
    agent with blocking sockets."""

    def __init__(self) -> None:
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._guard = threading.Lock()

    def _ensure(self) -> asyncio.AbstractEventLoop:
        with self._guard:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(
                    target=_run_then_close, args=(loop,), name="podbay-vm-relays", daemon=True
                )
                thread.start()
                self._loop, self._thread = loop, thread
            return self._loop

    async def call(self, coro: Coroutine[Any, Any, T]) -> T:
        future = asyncio.run_coroutine_threadsafe(coro, self._ensure())
        return await asyncio.wrap_future(future)

    def submit(self, coro: Coroutine[Any, Any, None]) -> concurrent.futures.Future[None]:
        """Run ``coro`` on the relay loop without waiting for it."""
        return asyncio.run_coroutine_threadsafe(coro, self._ensure())

    def stop(self) -> None:
        with self._guard:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is not None and thread is not None:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout=5)


def _run_then_close(loop: asyncio.AbstractEventLoop) -> None:
    """The relay thread: the loop runs until stopped, then is closed by this
    thread, which alone runs it (a stop whose wait for the thread ran out,
    on a loaded host, still leaves no unclosed loop behind)."""
    try:
        loop.run_forever()
    finally:
        loop.close()
