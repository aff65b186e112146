"""podbay's C programs, as built once at install time, found by the drivers.

The daemon never runs a compiler: :mod:`.native_build` (which ``./run``
calls before ``serve`` and ``test``) builds every program below into the
package's ``_native`` directory with a stamp of the sources it built; a
driver that needs them asks :func:`built`, which refuses a missing or stale
build with a :class:`DriverError` that names the step to run.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from podbay.agent.protocol import C_HEADER
from podbay.errors import DriverError

#: The installed ``podbay`` package: the sources are its package data.
PACKAGE = Path(__file__).resolve().parent.parent
#: Where :mod:`.native_build` puts the programs (not in git, not in the wheel).
NATIVE_DIR = PACKAGE / "_native"
#: The digest of the sources the programs in a build directory were made from.
STAMP = "sources.sha256"
BUILD_STEP = (
    "`./run serve` or `./run test` builds them (or `python -m podbay.runtime.native_build`)"
)


@dataclass(frozen=True)
class Program:
    #: The built file's name in the build directory.
    name: str
    #: The C source, relative to the package.
    source: str
    #: The compiler's flags for this program, beside the common ones.
    flags: tuple[str, ...]
    mode: int


PROGRAMS = (
    # Preloaded in gvisor sandboxes, so coreutils' statx calls work there.
    Program("statx-shim.so", "runtime/oci/statx_shim.c", ("-shared", "-fPIC"), 0o755),
    # The agent's launcher of commands under gVisor; static: whatever the image's libc.
    Program("launcher", "agent/launcher.c", ("-static",), 0o755),
    # Waits for a hibernating gvisor agent's next connection (agent/hibernate.py).
    Program("waiter", "agent/waiter.c", ("-static",), 0o755),
    # Sets a pooled gvisor machine's hostname at hand-out (runtime/oci/namer.py).
    Program("namer", "runtime/oci/namer.c", ("-static",), 0o755),
    # Starts `runsc run` in a machine's namespaces in one exec (host only).
    Program("runsc-enter", "runtime/oci/runsc_enter.c", (), 0o700),
)
#: Headers the programs include: a change to one is a change of the sources.
HEADERS = (f"agent/{C_HEADER}",)


def sources_digest() -> str:
    """What a build of the current sources is stamped with."""
    digest = hashlib.sha256()
    for program in PROGRAMS:
        digest.update(f"{program.name}\0{program.flags}\0".encode())
        digest.update((PACKAGE / program.source).read_bytes() + b"\0")
    for header in HEADERS:
        digest.update((PACKAGE / header).read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def built(directory: Path = NATIVE_DIR) -> Path:
    """``directory``, holding every program built from the current sources."""
    try:
        stamp = (directory / STAMP).read_text().strip()
    except FileNotFoundError:
        raise DriverError(
            f"podbay's C programs are not built (in {directory}): {BUILD_STEP}"
        ) from None
    if stamp != sources_digest():
        raise DriverError(
            f"podbay's C programs in {directory} were built from other sources: {BUILD_STEP}"
        )
    missing = [p.name for p in PROGRAMS if not (directory / p.name).is_file()]
    if missing:
        raise DriverError(
            f"podbay's C programs {missing} are missing from {directory}: {BUILD_STEP}"
        )
    return directory
