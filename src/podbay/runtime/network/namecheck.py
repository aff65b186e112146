"""The name check podbay runs for one sandbox whose egress policy names domains.

A resolver alone (:mod:`.resolver`) opens addresses, and one address serves
many names (a CDN, a shared host): a connection to an address an allowed name
gave may still be meant for a denied one. So every new TCP connection the
namespace's kernel stack sends off ``lo`` (a runc container's, QEMU's for a
vm guest) is redirected by ``ip podbay_names`` (:func:`.policy.names_redirect_batch`),
after ``inet podbay`` let its real destination through, to a socket of this
check: made by a thread that entered the namespace, on ``127.0.0.1`` and a
port the kernel chose. For each connection it

1. reads the real destination (``SO_ORIGINAL_DST``); a connection with none
   other than this socket itself (a sandbox connecting to it straight) is cut:
   it relays nothing but what was on its way out anyway;
2. connects there from inside the namespace with :data:`.policy.CHECK_MARK`,
   which the redirect lets by and the policy's rules judge again, while it
3. reads the client's first bytes (at most :data:`.sniff.MAX_PEEK`, within
   :data:`NAME_TIMEOUT` of the first one) and the name they give
   (:func:`.sniff.sniff`: a TLS ClientHello's SNI, an HTTP/1 request's
   ``Host``); a protocol whose server speaks first, or that is neither TLS
   nor HTTP, names nothing;
4. cuts it (a TCP reset) when a name is one the policy refuses
   (:meth:`~podbay.domain.egress.EgressPolicy.allows_named`), or the bytes
   are TLS or HTTP that does not parse; otherwise passes on what it read and
   relays both ways until either side ends.

The policy it checks against is the sandbox's current one (a live change
holds for the next connection). It lives in the node process: while that
restarts, the redirect leads nowhere, so connections are refused (closed,
not open) until :meth:`~.manager.NetworkManager.adopt` serves them again.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import ipaddress
import logging
import os
import socket
import struct
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ...domain.egress import EgressPolicy
from ...errors import ConnectionCut, NetworkError
from . import netns
from .policy import CHECK_MARK
from .sniff import MAX_PEEK, MORE, OTHER, Malformed, Named, Sniffed, sniff

__all__ = ["IDLE_TIMEOUT", "MAX_CONNECTIONS", "NAME_TIMEOUT", "NameCheck"]

log = logging.getLogger("podbay.runtime.network")

#: Connections one sandbox has through its check at once; beyond, a new one is
#: cut (each holds six of the node process's descriptors: two sockets, and a
#: pipe each way once relayed).
MAX_CONNECTIONS = 1024
#: From a client's first byte to its name: a trickling client is cut then.
NAME_TIMEOUT = 10.0
#: A connection on which neither side sent a byte is ended after this long.
IDLE_TIMEOUT = 60.0
_SO_ORIGINAL_DST = 80
_RELAY_CHUNK = 256 * 1024
_F_SETPIPE_SZ = 1031
_SPLICE_FLAGS = os.SPLICE_F_MOVE | os.SPLICE_F_NONBLOCK
#: Sockets onward made ahead: taking one costs a connection no hop to the
#: thread in the namespace (the hop, on a busy machine, took most of a millisecond).
_SPARES = 8


def _listen(path: Path | None, address: str) -> socket.socket:
    if path is not None:
        netns.enter(path)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)  # in the namespace
    try:
        sock.bind((address, 0))
        sock.listen(512)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


def _outgoing(marked: bool = True) -> socket.socket:
    """A socket in the namespace (the pool's thread entered it) that the
    redirect lets by (``marked``; on the host, being the node's is enough)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if marked:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_MARK, CHECK_MARK)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setblocking(False)
    return sock


def original_destination(sock: socket.socket) -> tuple[str, int]:
    """Where a redirected connection was going (its conntrack entry's)."""
    raw = sock.getsockopt(socket.SOL_IP, _SO_ORIGINAL_DST, 16)
    port = struct.unpack("!H", raw[2:4])[0]
    return socket.inet_ntoa(raw[4:8]), port


def _connect_now(
    loop: asyncio.AbstractEventLoop, sock: socket.socket, address: tuple[str, int]
) -> asyncio.Future[None]:
    """Start connecting at once (the SYN leaves before this returns, not a turn
    of the event loop later, as with a task); the future settles when done."""
    done: asyncio.Future[None] = loop.create_future()
    error = sock.connect_ex(address)
    if error == 0:
        done.set_result(None)
        return done
    if error != errno.EINPROGRESS:
        done.set_exception(OSError(error, os.strerror(error)))
        return done
    fd = sock.fileno()

    def writable() -> None:
        loop.remove_writer(fd)
        if done.done():
            return
        error = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        if error:
            done.set_exception(OSError(error, os.strerror(error)))
        else:
            done.set_result(None)

    # Whoever gives it up removes the writer then (synchronously: a done
    # callback would run a turn later, when the descriptor may be another's).
    loop.add_writer(fd, writable)
    return done


def _recv_now(
    loop: asyncio.AbstractEventLoop, sock: socket.socket, size: int
) -> asyncio.Future[bytes]:
    """A read whose future is done exactly when bytes were taken from the
    socket: cancelled before that, it took nothing. (A task around
    ``loop.sock_recv`` may have read and not yet be done: cancelling it then
    loses the bytes, e.g. a server's first answer.)"""
    done: asyncio.Future[bytes] = loop.create_future()
    fd = sock.fileno()

    def readable() -> None:
        if done.done():
            loop.remove_reader(fd)
            return
        try:
            data = sock.recv(size)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            loop.remove_reader(fd)
            done.set_exception(exc)
            return
        loop.remove_reader(fd)
        done.set_result(data)

    # Whoever gives it up removes the reader then (see _first_bytes), not in a
    # done callback: that runs a turn later, when the relay may have put its own.
    loop.add_reader(fd, readable)
    return done


def _reset(sock: socket.socket) -> None:
    """Close with a reset, as the policy's refusals do: the client fails at once."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


class NameCheck:
    """``netns_path``: the namespace whose kernel stack is redirected here; ``None``:
    the host's own, for a gVisor sandbox, whose TCP leaves as sockets of its
    slirp4netns (:func:`.policy.slirp_names_redirect_batch`). Then the check
    listens on ``address``, the host-loopback address that sandbox's resolver
    holds (no other machine's, and no port of it another process's while
    the node is down, unless one listens on the wildcard address), and
    connects onward from the host, to the destination gVisor's frame named,
    which ``tap0``'s rules let through."""

    def __init__(
        self,
        netns_path: Path | None,
        policy: EgressPolicy,
        label: str,
        address: str = "127.0.0.1",
    ) -> None:
        self.netns_path = netns_path
        self.address = address
        #: The policy the next connection is checked against.
        self.policy = policy
        self.label = label
        #: Connections cut and passed so far (what the log says, counted).
        self.cut = 0
        self.passed = 0
        self._listener: socket.socket | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._serving: asyncio.Task[None] | None = None
        self._connections: set[asyncio.Task[None]] = set()
        self._spares: list[socket.socket] = []
        self._refilling: asyncio.Future[list[socket.socket]] | None = None

    @property
    def port(self) -> int:
        if self._listener is None:
            raise NetworkError("the name check is not listening")
        return int(self._listener.getsockname()[1])

    async def start(self) -> None:
        try:
            self._listener = await netns.in_fresh_thread(
                lambda: _listen(self.netns_path, self.address)
            )
        except OSError as exc:
            raise NetworkError(f"the name check cannot serve {self.netns_path}: {exc}") from exc
        # One thread that stays in the namespace makes the sockets onward: a
        # socket belongs to the namespace of the thread that made it.
        if self.netns_path is None:
            self._pool = ThreadPoolExecutor(1, thread_name_prefix="podbay-namecheck")
        else:
            self._pool = ThreadPoolExecutor(
                1,
                thread_name_prefix="podbay-namecheck",
                initializer=netns.enter,
                initargs=(self.netns_path,),
            )
        self._refill()
        self._serving = asyncio.ensure_future(self._serve())

    def _refill(self) -> None:
        """Make spare sockets onward in the background, up to :data:`_SPARES`."""
        if self._refilling is not None or self._pool is None:
            return
        wanted = _SPARES - len(self._spares)
        if wanted <= 0:
            return

        def made(future: asyncio.Future[list[socket.socket]]) -> None:
            self._refilling = None
            if future.cancelled() or future.exception() is not None:
                return
            if self._pool is None:  # closed meanwhile
                for sock in future.result():
                    sock.close()
                return
            self._spares += future.result()

        loop = asyncio.get_running_loop()
        marked = self.netns_path is not None
        refill = loop.run_in_executor(
            self._pool, lambda: [_outgoing(marked) for _ in range(wanted)]
        )
        refill.add_done_callback(made)
        self._refilling = refill

    async def _socket_onward(self) -> socket.socket:
        if self._spares:
            sock = self._spares.pop()
            if len(self._spares) < _SPARES // 2:
                self._refill()
            return sock
        self._refill()
        marked = self.netns_path is not None
        return await asyncio.get_running_loop().run_in_executor(
            self._pool, lambda: _outgoing(marked)
        )

    async def close(self) -> None:
        if self._serving is not None:
            self._serving.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._serving
            self._serving = None
        for task in list(self._connections):
            task.cancel()
        if self._connections:
            await asyncio.gather(*self._connections, return_exceptions=True)
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        if self._pool is not None:
            # Its thread holds the namespace: it ends here, not later.
            pool, self._pool = self._pool, None
            await asyncio.get_running_loop().run_in_executor(None, pool.shutdown)
        for sock in self._spares:
            sock.close()
        self._spares.clear()

    async def _serve(self) -> None:
        assert self._listener is not None
        loop = asyncio.get_running_loop()
        while True:
            try:
                client, _ = await loop.sock_accept(self._listener)
            except OSError as exc:  # e.g. out of descriptors: the next may work
                log.warning("name check of %s: accept failed: %s", self.label, exc)
                await asyncio.sleep(0.1)
                continue
            if len(self._connections) >= MAX_CONNECTIONS:
                self.cut += 1
                _reset(client)
                continue
            task = asyncio.ensure_future(self._connection(client))
            self._connections.add(task)
            task.add_done_callback(self._connections.discard)

    async def _connection(self, client: socket.socket) -> None:
        upstream: socket.socket | None = None
        destination = ("?", 0)
        try:
            client.setblocking(False)
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            destination = self._destination(client)
            loop = asyncio.get_running_loop()
            upstream = await self._socket_onward()
            connected = _connect_now(loop, upstream, destination)
            try:
                found, sent, answered = await self._first_bytes(client, upstream, connected)
                self._judge(found, destination[0])
                await connected
            except BaseException:
                if connected.done():
                    connected.exception()  # retrieved: the cut is what is reported
                else:
                    loop.remove_writer(upstream.fileno())
                    connected.cancel()
                raise
            self.passed += 1
            if sent:
                await loop.sock_sendall(upstream, sent)
            if answered:
                await loop.sock_sendall(client, answered)
            await self._relay(client, upstream)
        except ConnectionCut as cut:
            self.cut += 1
            log.info(
                "name check of %s: cut a connection to %s:%d: %s", self.label, *destination, cut
            )
            _reset(client)
            if upstream is not None:
                self._end_onward(upstream)
            return
        except (OSError, TimeoutError):
            # The far end refused or vanished (or the client did): pass it on
            # as a reset, which is what the client would have met directly.
            _reset(client)
            if upstream is not None:
                self._end_onward(upstream)
            return
        except BaseException:
            _reset(client)
            if upstream is not None:
                _reset(upstream)
            raise
        client.close()
        upstream.close()

    def _end_onward(self, upstream: socket.socket) -> None:
        """End a connection onward that carried none of the client's bytes.

        In the sandbox's namespace: a reset. On the host (gVisor's check) a
        plain close: its connections onward share the host's ports with
        slirp4netns's own, and a reset while the handshake is under way can
        leave a conntrack entry that is not closed; a later connection of
        slirp4netns's on the same port pair then joins that entry, un-NATed,
        past the redirect (in a bench of 50 connections cut one after another,
        every later one was reset or refused)."""
        if self.netns_path is None:
            upstream.close()
        else:
            _reset(upstream)

    def _destination(self, client: socket.socket) -> tuple[str, int]:
        try:
            address, port = original_destination(client)
        except OSError as exc:
            raise ConnectionCut(f"no original destination ({exc.strerror})") from None
        if ipaddress.ip_address(address).is_loopback:
            # Not redirected: a connection to this socket itself (a sandbox, or
            # a vm guest through QEMU's gateway, reaching 127.0.0.1 straight).
            raise ConnectionCut("a connection straight to the check, not through it")
        return address, port

    def _judge(self, found: Sniffed, address: str) -> None:
        if isinstance(found, Malformed):
            raise ConnectionCut(f"{found.protocol} that does not parse: {found.why}")
        if isinstance(found, Named):
            for name in found.names:
                if not self.policy.allows_named(name, address):
                    raise ConnectionCut(
                        f"{found.protocol} names {name!r}, which the policy refuses"
                    )
        elif found is not OTHER:
            raise ConnectionCut("no name")

    async def _first_bytes(
        self, client: socket.socket, upstream: socket.socket, connected: asyncio.Future[None]
    ) -> tuple[Sniffed, bytes, bytes]:
        """What the client's first bytes name, those bytes, and the server's
        first bytes if it spoke first (then nothing is named: neither TLS nor
        HTTP lets a server speak first)."""
        loop = asyncio.get_running_loop()
        sent = b""
        answered = b""
        client_read = _recv_now(loop, client, MAX_PEEK)
        server_read: asyncio.Future[bytes] | None = None
        pending: set[asyncio.Future[object]] = {client_read, connected}  # type: ignore[arg-type]
        try:
            async with asyncio.timeout(IDLE_TIMEOUT) as deadline:
                while True:
                    done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                    pending -= done
                    if client_read in done:
                        data = client_read.result()
                        if not data:
                            raise ConnectionCut("the client ended before naming anything")
                        if not sent:
                            when = min(deadline.when() or 0.0, loop.time() + NAME_TIMEOUT)
                            deadline.reschedule(when)
                        sent += data
                        if server_read is not None and not server_read.done():
                            # The client spoke first: it decides. Not done,
                            # the read took nothing (_recv_now).
                            loop.remove_reader(upstream.fileno())
                            server_read.cancel()
                            pending.discard(server_read)
                            server_read = None
                        found = sniff(sent)
                        if found is not MORE:
                            if server_read is not None and server_read in done:
                                answered = server_read.result()
                            return found, sent, answered
                        if len(sent) >= MAX_PEEK:
                            raise ConnectionCut(f"no name in the first {MAX_PEEK} bytes")
                        client_read = _recv_now(loop, client, MAX_PEEK - len(sent))
                        pending.add(client_read)  # type: ignore[arg-type]
                    if connected in done:
                        connected.result()  # a refused connection raises here
                        if not sent:
                            server_read = _recv_now(loop, upstream, 65536)
                            pending.add(server_read)  # type: ignore[arg-type]
                    if server_read is not None and server_read in done:
                        answered = server_read.result()
                        if not sent:
                            return OTHER, sent, answered
                        server_read = None  # read with the client's: kept for it
        except TimeoutError:
            raise ConnectionCut("no name in time" if sent else "nothing sent in time") from None
        finally:
            for future, sock in ((client_read, client), (server_read, upstream)):
                if future is not None and not future.done():
                    loop.remove_reader(sock.fileno())
                    future.cancel()

    async def _relay(self, client: socket.socket, upstream: socket.socket) -> None:
        """Both ways until both ends are done; a reset on either side resets the
        other (the caller's)."""
        loop = asyncio.get_running_loop()
        pumps = [_Splice(loop, client, upstream), _Splice(loop, upstream, client)]
        try:
            finished, _ = await asyncio.wait(
                [pump.done for pump in pumps], return_when=asyncio.FIRST_EXCEPTION
            )
            failures = [f.exception() for f in finished]  # each retrieved, one raised
            for failure in failures:
                if failure is not None:
                    raise failure
        finally:
            for pump in pumps:
                pump.stop()


class _Splice:
    """One direction of a connection, moved by ``splice(2)`` through a pipe:
    the bytes stay in the kernel, and the event loop only hears when a side is
    ready (no copy into this process, no task per chunk)."""

    def __init__(
        self, loop: asyncio.AbstractEventLoop, source: socket.socket, target: socket.socket
    ) -> None:
        self.loop = loop
        self.source = source.fileno()
        self.target = target
        self.done: asyncio.Future[None] = loop.create_future()
        self.pipe_read, self.pipe_write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        with contextlib.suppress(OSError):  # the default (64 KiB) works too
            fcntl.fcntl(self.pipe_write, _F_SETPIPE_SZ, _RELAY_CHUNK)
        self.buffered = 0
        self.ended = False
        self.stopped = False
        loop.add_reader(self.source, self._readable)
        # What is there already (a server's answer that came while the name
        # was judged) goes at once, not a turn of the event loop later.
        self._readable()

    def _readable(self) -> None:
        try:
            count = os.splice(self.source, self.pipe_write, _RELAY_CHUNK, flags=_SPLICE_FLAGS)
        except BlockingIOError:
            return
        except OSError as exc:
            self._finish(exc)
            return
        if count == 0:
            self.ended = True
            self.loop.remove_reader(self.source)
        self.buffered += count
        self._flush()

    def _flush(self) -> None:
        while self.buffered:
            try:
                count = os.splice(
                    self.pipe_read, self.target.fileno(), self.buffered, flags=_SPLICE_FLAGS
                )
            except BlockingIOError:
                # The far side is full: hold the source until it drains.
                self.loop.remove_reader(self.source)
                self.loop.add_writer(self.target.fileno(), self._writable)
                return
            except OSError as exc:
                self._finish(exc)
                return
            self.buffered -= count
        if self.ended:
            with contextlib.suppress(OSError):
                self.target.shutdown(socket.SHUT_WR)
            self._finish(None)

    def _writable(self) -> None:
        self.loop.remove_writer(self.target.fileno())
        self._flush()
        if not self.buffered and not self.ended and not self.stopped:
            self.loop.add_reader(self.source, self._readable)

    def _finish(self, error: OSError | None) -> None:
        self.stop()
        if not self.done.done():
            if error is None:
                self.done.set_result(None)
            else:
                self.done.set_exception(error)

    def stop(self) -> None:
        if self.stopped:
            return
        self.stopped = True
        self.loop.remove_reader(self.source)
        with contextlib.suppress(OSError, ValueError):
            self.loop.remove_writer(self.target.fileno())
        os.close(self.pipe_read)
        os.close(self.pipe_write)
