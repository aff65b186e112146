"""A minimal QMP client: one short connection per command.

QEMU's QMP socket serves one client at a time; the driver holds the machine's
lock around each call, so a connection per command is simplest and survives
a server restart (``adopt`` just connects again).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from ..base import DriverError


async def execute(
    socket_path: Path,
    command: str,
    arguments: dict[str, Any] | None = None,
    *,
    within: float = 10.0,
) -> Any:
    """Run one QMP command; its ``return`` value. Raises :class:`DriverError`
    (or ``OSError`` when nothing listens: QEMU is gone)."""
    async with asyncio.timeout(within):
        reader, writer = await asyncio.open_unix_connection(str(socket_path), limit=1 << 20)
        try:
            await _answer(reader)  # the greeting
            for name, args in (("qmp_capabilities", None), (command, arguments)):
                message: dict[str, Any] = {"execute": name}
                if args:
                    message["arguments"] = args
                writer.write(json.dumps(message).encode() + b"\n")
                await writer.drain()
                reply = await _answer(reader)
                if "error" in reply:
                    raise DriverError(f"QMP {name}: {reply['error'].get('desc', reply)}")
            return reply.get("return")
        finally:
            writer.close()


async def migrate(socket_path: Path, uri: str, *, within: float, failure: str) -> None:
    """Start QMP ``migrate`` to ``uri`` and wait until QEMU reports it
    completed; :class:`DriverError` beginning with ``failure`` when it failed
    or was cancelled (``TimeoutError`` past ``within`` seconds)."""
    await execute(socket_path, "migrate", {"uri": uri})
    async with asyncio.timeout(within):
        while True:
            info = await execute(socket_path, "query-migrate")
            status = info.get("status")
            if status == "completed":
                return
            if status in ("failed", "cancelled"):
                raise DriverError(f"{failure}: {info.get('error-desc', info)}")
            await asyncio.sleep(0.02)


async def _answer(reader: asyncio.StreamReader) -> dict[str, Any]:
    """The next message that is not an asynchronous event."""
    while True:
        line = await reader.readline()
        if not line:
            raise ConnectionResetError("QMP connection closed")
        message: dict[str, Any] = json.loads(line)
        if "event" not in message:
            return message
