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
``lo``: its lookups keep going to slirp's forwarder, which default-deny
refuses (docs/network.md says so).
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
        named: Named | None = None,
    ) -> None:
        self.netns_path = netns_path
        self.policy = policy
        self.upstream = upstream
        self.allow = allow
        self.named = named
        #: Addresses answered, with when they expire (monotonic): what a
        #: reload of the rules puts back into the fresh set.
        self.answered: dict[str, float] = {}
        self._transport: asyncio.DatagramTransport | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
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
        loop = asyncio.get_running_loop()
        self._transport, _ = await loop.create_datagram_endpoint(lambda: _Protocol(self), sock=sock)

    async def close(self) -> None:
        if self._transport is not None:
            self._transport.close()
            self._transport = None
        for task in list(self._tasks):
            task.cancel()
        with contextlib.suppress(OSError):
            await netns.in_fresh_thread(lambda: _address(self.netns_path, "del"))

    def live(self) -> list[tuple[str, int]]:
        """Answered addresses not yet expired, with the seconds they have left."""
        now = time.monotonic()
        return [(a, int(t - now) + 1) for a, t in self.answered.items() if t > now]

    def received(self, data: bytes, addr: tuple[str, int]) -> None:
        task = asyncio.ensure_future(self._answer(data, addr))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _answer(self, data: bytes, addr: tuple[str, int]) -> None:
        asked = dnswire.question(data)
        if asked is None:
            return  # not a query: no answer, as a resolver does
        if not self.policy.allows_name(asked.name):
            self._send(dnswire.refusal(data, asked), addr)
            return
        try:
            answer = await self._ask_upstream(data)
        except (OSError, TimeoutError) as exc:
            log.info("resolver %s: upstream failed for %s: %s", self.netns_path, asked.name, exc)
            return
        records = [(a, min(max(ttl, MIN_TTL), MAX_TTL)) for a, ttl in dnswire.a_records(answer)]
        if records and self.named is not None:
            self.named(asked.name, [address for address, _ in records])
        if records and self.policy.default_deny:  # an open default lets them out anyway
            await self.allow(records)
            now = time.monotonic()
            for address, ttl in records:
                self.answered[address] = max(self.answered.get(address, 0.0), now + ttl)
        self._send(answer, addr)

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
