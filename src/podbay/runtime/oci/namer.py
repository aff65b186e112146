"""A gVisor sandbox's hostname, set at hand-out without starting runsc then.

gVisor keeps the sandbox's UTS namespace in its own kernel (its
``/proc/sys/kernel/hostname`` is read-only), so only a process inside with
``CAP_SYS_ADMIN`` can rename it: a ``runsc exec`` of ``hostname``, a Go
process start that talks to the sentry, which then loads ``hostname`` (38 ms
of a warm pool's 114 ms hand-out). A machine that will be named later (a warm
pool's, :attr:`MachineSpec.named_later`) gets that ``runsc exec`` started
while it waits in the pool: podbay's static ``namer.c`` (or, where the
sandbox lacks it, the image's shell and ``hostname``) blocks inside on a pipe
this process holds. Handing the machine out writes the name and waits for
that process to exit.

Nothing of the sandbox's owner runs before that: the privileged process is
either gone (named, or ended by :meth:`Namer.close`, which closes the pipe so
that its read sees EOF) before the machine is handed out, or the driver
falls back to ``runsc exec`` itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

log = logging.getLogger(__name__)

#: What runs inside where the sandbox has no ``namer.c``: the name read from
#: the pipe (EOF: nothing set), then the image's ``hostname``, as before.
SCRIPT = 'read -r name && exec /bin/hostname "$name"'

#: How long a hand-out waits for the naming process before ``runsc exec``
#: is run instead (a sandbox this slow is also named that way).
NAME_TIMEOUT_SECONDS = 10.0


def nameable(hostname: str) -> bool:
    """Whether ``hostname`` passes through ``read -r`` and ``hostname`` (and
    ``namer.c``'s one line) unchanged: one word, not an option."""
    return (
        bool(hostname)
        and not hostname.startswith("-")
        and hostname.isprintable()
        and (not any(c.isspace() for c in hostname))
    )


class Namer:
    """The ``runsc exec`` waiting for one machine's hostname on its stdin."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process

    async def name(self, hostname: str) -> bool:
        """Set ``hostname``; ``False`` when this process could not (it is then
        ended, and the caller sets the name another way)."""
        process = self.process
        if not nameable(hostname) or process.returncode is not None or process.stdin is None:
            await self.close()
            return False
        try:
            process.stdin.write(hostname.encode() + b"\n")
            await process.stdin.drain()
            process.stdin.close()
            async with asyncio.timeout(NAME_TIMEOUT_SECONDS):
                code = await process.wait()
        except (OSError, TimeoutError) as e:
            log.warning("naming a sandbox through its waiting process failed: %r", e)
            await self.close()
            return False
        if code != 0:
            stderr = await process.stderr.read() if process.stderr is not None else b""
            log.warning("naming a sandbox exited %d: %s", code, stderr.decode(errors="replace"))
        return code == 0

    async def close(self) -> None:
        """End it without a name: its ``read`` sees the pipe closed and exits;
        ``runsc exec`` is killed if it lingers."""
        process = self.process
        if process.stdin is not None:
            process.stdin.close()
        if process.returncode is None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(1.0):
                    await process.wait()
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()
