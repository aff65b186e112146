"""Build podbay's C programs (:data:`.native.PROGRAMS`) with the host's C
compiler, warnings as errors, into :data:`.native.NATIVE_DIR`.

``python -m podbay.runtime.native_build`` builds when the sources changed
since the last build (``--check``: only say whether they did, by the exit
status); ``./run`` calls it before ``serve`` and ``test``. The launcher's
protocol header must be what :func:`podbay.agent.protocol.c_header` makes
(``--write-header`` rewrites it). Nothing the daemon imports imports this
module: the daemon never runs a compiler (an import contract in
pyproject.toml holds it so).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

from podbay.agent.protocol import C_HEADER, c_header
from podbay.errors import DriverError

from .native import NATIVE_DIR, PACKAGE, PROGRAMS, STAMP, built, sources_digest

#: Every program's: all warnings, and none let through.
COMMON_FLAGS = ("-Wall", "-Wextra", "-Werror", "-O2")
HEADER = PACKAGE / "agent" / C_HEADER


def header_is_current() -> bool:
    return HEADER.read_text() == c_header()


def is_current(directory: Path = NATIVE_DIR) -> bool:
    try:
        built(directory)
    except DriverError:
        return False
    return True


def build(directory: Path = NATIVE_DIR, *, compiler: str | None = None) -> Path:
    """Every program built into a fresh directory that then replaces ``directory``
    in one rename (a running daemon's copies are its own)."""
    if not header_is_current():
        raise DriverError(
            f"{HEADER} is not what podbay/agent/protocol.py generates: "
            "`python -m podbay.runtime.native_build --write-header` rewrites it"
        )
    cc = compiler or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise DriverError(
            "no C compiler to build podbay's C programs (apt-get install gcc libc6-dev)"
        )
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = directory.with_name(f".{directory.name}.{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(mode=0o755)
    try:
        for program in PROGRAMS:
            output = tmp / program.name
            argv = [
                cc,
                *COMMON_FLAGS,
                *program.flags,
                "-o",
                str(output),
                str(PACKAGE / program.source),
            ]
            made = subprocess.run(argv, capture_output=True, text=True, check=False)
            if made.returncode != 0:
                raise DriverError(f"building {program.source} failed: {made.stderr[-2000:]}")
            os.chmod(output, program.mode)
        (tmp / STAMP).write_text(sources_digest() + "\n")
        old = directory.with_name(f".{directory.name}.old.{os.getpid()}")
        if directory.exists():
            os.rename(directory, old)
        os.rename(tmp, directory)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return directory


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m podbay.runtime.native_build")
    parser.add_argument("--check", action="store_true", help="exit 1 if a build is due")
    parser.add_argument("--write-header", action="store_true", help="regenerate the C header")
    parser.add_argument("--into", type=Path, default=NATIVE_DIR, help="the build directory")
    args = parser.parse_args(argv)
    if args.write_header:
        HEADER.write_text(c_header())
    if args.check:
        return 0 if header_is_current() and is_current(args.into) else 1
    if is_current(args.into):
        return 0
    try:
        build(args.into)
    except DriverError as exc:
        print(f"podbay: {exc}", file=sys.stderr)
        return 1
    print(f"podbay: C programs built in {args.into}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
