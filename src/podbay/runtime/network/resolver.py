"""The resolver podbay serves to one sandbox whose egress policy names domains.

It answers at ``10.0.2.3:53`` (UDP) *inside* the sandbox's namespace: the
address is put on the namespace's ``lo``, so what the namespace's own kernel
sends there (a runc container's lookups, QEMU's forwarding of a vm guest's)
is delivered to this socket instead of leaving through ``tap0`` to slirp's
forwarder, which would answer any name. A name the policy refuses gets
REFUSED at once; an allowed one is asked of the upstream resolver (from the
host's namespace) and every IPv4 address of the answer is added to the
sandbox's ``resolved_v4`` set, with its TTL, *before* the answer is sent, so
the connection that follows passes. An address no allowed name gave stays
refused by the policy's default-deny.

gVisor's netstack sends on ``tap0`` itself and never meets the namespace's
``lo``: its lookups go to slirp's forwarder, which for such a sandbox asks a
per-sandbox address on the host's loopback (:mod:`.slirpdns`). There the
resolver listens instead (``host_address``), in the host's namespace, and
serves every policy, forwarding any name under an open one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import subprocess
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from ...domain.egress import EgressPolicy
from ...errors import NetworkError
from . import dnswire, netns
from .policy import SLIRP_DNS

__all__ = ["MAX_TTL", "MIN_TTL", "Resolver"]

log = logging.getLogger("podbay.runtime.network")

#: An answered address stays allowed at least this long: a TTL of 0 (common
#: for local answers) would otherwise expire before the client connects.
MIN_TTL = 60
MAX_TTL = 86_400
_UPSTREAM_TIMEOUT = 3.0
_MAX_MESSAGE = 4096
#: Queries one sandbox may have waiting on the upstream at once (each holds a
#: socket of the node's): beyond, a datagram is dropped (its client retries).
MAX_IN_FLIGHT = 64
#: DNS-over-TCP connections one sandbox may hold open (host mode only), and
#: how long one may sit idle.
MAX_STREAMS = 8
_STREAM_IDLE = 10.0

#: Adds ``[(address, seconds)]`` to the sandbox's set; returns once in force.
Allow = Callable[[list[tuple[str, int]]], Awaitable[None]]
#: Told which allowed name an answer gave which IPv4 addresses (the audit's names).
Named = Callable[[str, list[str]], None]


def _address(path: Path, verb: str) -> None:
    netns.enter(path)
    # A child forked from this thread is in the namespace too.
    subprocess.run(
        ["ip", "addr", verb, f"{SLIRP_DNS}/32", "dev", "lo"],
        check=verb == "replace",
        capture_output=True,
    )


class _Protocol(asyncio.DatagramProtocol):
    def __init__(self, resolver: Resolver) -> None:
        self.resolver = resolver

    def datagram_received(self, data: bytes, addr: tuple[str, int]) -> None:
        self.resolver.received(data, addr)


class Resolver:
    def __init__(
        self,
        netns_path: Path,
        policy: EgressPolicy,
        upstream: tuple[str, int],
        allow: Allow,
        *,
        named: Named | None = None,
        host_address: str | None = None,
    ) -> None:
        self.netns_path = netns_path
        #: Where it listens in the host's namespace (slirp4netns's forwarder asks
        #: there); ``None``: at 10.0.2.3 on the sandbox namespace's ``lo``.
        self.host_address = host_address
        self.policy = policy
        self.upstream = upstream
        self.allow = allow
        self.named = named
        #: Addresses answered, with when they expire (monotonic): what a
        #: reload of the rules puts back into the fresh set.
        self.answered: dict[str, float] = {}
        self._transport: asyncio.DatagramTransport | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._server: asyncio.Server | None = None
        self._streams: set[asyncio.StreamWriter] = set()

    async def start(self) -> None:
        """Listen; :class:`NetworkError` if the address is taken (``EADDRINUSE``:
        its ``__cause__``) or cannot be had."""
        if self.host_address is not None:
            # UDP and TCP (slirp4netns forwards both to the address), in the
            # host's namespace. No SO_REUSEADDR on UDP: the address is this
            # sandbox's alone (TCP's only lets a listener follow TIME_WAITs).
            udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                udp.bind((self.host_address, 53))
                tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                tcp.bind((self.host_address, 53))
                tcp.listen(MAX_STREAMS)
            except OSError as exc:
                udp.close()
                tcp.close()
                raise NetworkError(
                    f"podbay's resolver for {self.netns_path} cannot listen on "
                    f"{self.host_address}:53: {exc}"
                ) from exc
            udp.setblocking(False)
            tcp.setblocking(False)
            await self._serve(udp)
            self._server = await asyncio.start_server(self._stream, sock=tcp)
            return

        def make() -> socket.socket:
            _address(self.netns_path, "replace")
            sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)  # in the namespace
            sock.bind((SLIRP_DNS, 53))
            sock.setblocking(False)
            return sock

        try:
            sock = await netns.in_fresh_thread(make)
        except (OSError, subprocess.CalledProcessError) as exc:
            raise NetworkError(f"podbay's resolver cannot serve {self.netns_path}: {exc}") from exc
        await self._serve(sock)

    async def _serve(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        self._transport, _ = await loop.create_datagram_endpoint(lambda: _Protocol(self), sock=sock)

    async def close(self) -> None:
        if self._transport is not None:
            self._transport.close()
            self._transport = None
        if self._server is not None:
            self._server.close()
            self._server = None
        for writer in list(self._streams):
            writer.close()
        for task in list(self._tasks):
            task.cancel()
        if self.host_address is not None:
            return  # nothing was put in the namespace
        with contextlib.suppress(OSError):
            await netns.in_fresh_thread(lambda: _address(self.netns_path, "del"))

    def live(self) -> list[tuple[str, int]]:
        """Answered addresses not yet expired, with the seconds they have left."""
        now = time.monotonic()
        return [(a, int(t - now) + 1) for a, t in self.answered.items() if t > now]

    def received(self, data: bytes, addr: tuple[str, int]) -> None:
        if len(self._tasks) >= MAX_IN_FLIGHT:
            return  # a flood: what the node holds for one sandbox stays bounded
        task = asyncio.ensure_future(self._answer(data, addr))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _answer(self, data: bytes, addr: tuple[str, int]) -> None:
        answer = await self._reply(data, self._ask_upstream)
        if answer is not None:
            self._send(answer, addr)

    async def _reply(self, data: bytes, ask: Callable[[bytes], Awaitable[bytes]]) -> bytes | None:
        """The answer to the query ``data`` (``None``: none is sent): REFUSED for
        a name the policy refuses, otherwise the upstream's, its addresses
        allowed first."""
        asked = dnswire.question(data)
        if asked is None:
            return None  # not a query: no answer, as a resolver does
        if not self.policy.allows_name(asked.name):
            return dnswire.refusal(data, asked)
        try:
            answer = await ask(data)
        except (OSError, TimeoutError, asyncio.IncompleteReadError) as exc:
            log.info("resolver %s: upstream failed for %s: %s", self.netns_path, asked.name, exc)
            return None
        records = [(a, min(max(ttl, MIN_TTL), MAX_TTL)) for a, ttl in dnswire.a_records(answer)]
        if records and self.named is not None:
            self.named(asked.name, [address for address, _ in records])
        if records and self.policy.default_deny:  # an open default lets them out anyway
            await self.allow(records)
            now = time.monotonic()
            for address, ttl in records:
                self.answered[address] = max(self.answered.get(address, 0.0), now + ttl)
        return answer

    async def _stream(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One DNS-over-TCP connection (RFC 7766: length-prefixed messages), each
        query answered as one over UDP is, the upstream asked over TCP."""
        if len(self._streams) >= MAX_STREAMS:
            writer.close()
            return
        self._streams.add(writer)
        try:
            while True:
                async with asyncio.timeout(_STREAM_IDLE):
                    size = int.from_bytes(await reader.readexactly(2), "big")
                    query = await reader.readexactly(size)
                answer = await self._reply(query, self._ask_upstream_tcp)
                if answer is None:
                    return
                writer.write(len(answer).to_bytes(2, "big") + answer)
                await writer.drain()
        except (OSError, TimeoutError, asyncio.IncompleteReadError):
            return
        finally:
            self._streams.discard(writer)
            writer.close()

    async def _ask_upstream_tcp(self, data: bytes) -> bytes:
        async with asyncio.timeout(_UPSTREAM_TIMEOUT):
            reader, writer = await asyncio.open_connection(*self.upstream)  # the host's namespace
            try:
                writer.write(len(data).to_bytes(2, "big") + data)
                await writer.drain()
                size = int.from_bytes(await reader.readexactly(2), "big")
                return await reader.readexactly(size)
            finally:
                writer.close()

    async def _ask_upstream(self, data: bytes) -> bytes:
        loop = asyncio.get_running_loop()
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:  # the host's namespace
            sock.setblocking(False)
            sock.connect(self.upstream)
            await loop.sock_sendall(sock, data)
            async with asyncio.timeout(_UPSTREAM_TIMEOUT):
                while True:
                    answer = await loop.sock_recv(sock, _MAX_MESSAGE)
                    if answer[:2] == data[:2]:  # its id: not a stray datagram
                        return answer

    def _send(self, data: bytes, addr: tuple[str, int]) -> None:
        if self._transport is not None:
            self._transport.sendto(data, addr)
