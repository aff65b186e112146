"""Running a host tool (cp, mkfs.ext4, runc, nsenter, qemu, ...) to its end.

One home for what every driver does with a tool: no stdin, stdout and stderr
merged into one text (the tool's own words are the best error message), and a
:class:`~podbay.errors.DriverError` that says what failed when it exits badly.
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Container, Mapping

from podbay.errors import DriverError

#: How much of a failed tool's output a DriverError quotes (its last words).
QUOTED_CHARS = 800


async def run_tool(
    *argv: str, env: Mapping[str, str] | None = None, new_session: bool = False
) -> tuple[int, str]:
    """Run ``argv``; its exit code and its output (stdout and stderr), stripped.

    The tool has ended when it exits, not when its output pipe closes: a tool
    that daemonises (QEMU) leaves a child holding the output, and under uvloop,
    whose child pipes are socket pairs, that end never came and no vm machine
    started. So the output goes to an unnamed file, read after the exit."""
    with tempfile.TemporaryFile() as output:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=output,
            stderr=asyncio.subprocess.STDOUT,
            env=env,
            start_new_session=new_session,
        )
        code = await proc.wait()
        output.seek(0)
        out = output.read()
    return code, out.decode(errors="replace").strip()


async def check_tool(
    *argv: str,
    failed: str,
    ok: Container[int] = (0,),
    env: Mapping[str, str] | None = None,
    new_session: bool = False,
) -> str:
    """Run ``argv``; its output, or DriverError ``"{failed}: {output}"`` when it
    exits with a code not in ``ok``."""
    code, text = await run_tool(*argv, env=env, new_session=new_session)
    if code not in ok:
        raise DriverError(f"{failed}: {text[-QUOTED_CHARS:]}")
    return text
