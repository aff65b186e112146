"""Notice when the host gains or loses an address (rtnetlink), to refresh the rules.

The policy refuses every address the host has; those addresses are read when
a machine's rules are loaded. A machine started before the host gained an
address (a warm one, in a pool) would otherwise reach the host on it. The
kernel announces every address change on the ``RTMGRP_IPV4_IFADDR`` and
``RTMGRP_IPV6_IFADDR`` groups; one refresh runs per burst of changes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Awaitable, Callable

__all__ = ["AddressWatch"]

log = logging.getLogger("podbay.runtime.network")

_RTMGRP_IPV4_IFADDR = 0x10
_RTMGRP_IPV6_IFADDR = 0x100


class AddressWatch:
    """Calls ``on_change`` after the host namespace's addresses changed.

    Changes that arrive while ``on_change`` runs cause one more call after it,
    so the last change is always followed by a complete refresh."""

    def __init__(self, on_change: Callable[[], Awaitable[None]]) -> None:
        self.on_change = on_change
        self._sock: socket.socket | None = None
        self._task: asyncio.Task[None] | None = None
        self._again = False

    def start(self) -> None:
        if self._sock is not None:
            return
        sock = socket.socket(
            socket.AF_NETLINK,
            socket.SOCK_RAW | socket.SOCK_NONBLOCK | socket.SOCK_CLOEXEC,
            socket.NETLINK_ROUTE,
        )
        sock.bind((0, _RTMGRP_IPV4_IFADDR | _RTMGRP_IPV6_IFADDR))
        asyncio.get_running_loop().add_reader(sock.fileno(), self._readable)
        self._sock = sock

    def _readable(self) -> None:
        assert self._sock is not None
        # The messages' content does not matter: any change means "read them again".
        # An overrun (ENOBUFS) means changes were lost, which calls for the same.
        with contextlib.suppress(BlockingIOError, OSError):
            while self._sock.recv(65536):
                pass
        if self._task is not None and not self._task.done():
            self._again = True
            return
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        while True:
            self._again = False
            try:
                await self.on_change()
            except Exception:
                log.exception("refreshing the sandbox rules after an address change failed")
            if not self._again:
                return

    async def close(self) -> None:
        if self._sock is not None:
            with contextlib.suppress(RuntimeError):
                asyncio.get_running_loop().remove_reader(self._sock.fileno())
            self._sock.close()
            self._sock = None
        if self._task is not None:
            with contextlib.suppress(BaseException):
                await self._task
            self._task = None
