"""The ``podbay`` command: ``sandbox exec`` takes the quick path when it can
(:mod:`podbay.cli.quick_exec`, standard library only); everything else, and
every case the quick path hands over, runs the full command line
(:mod:`podbay.cli.main`, click). This module imports nothing else, so the
quick path starts as fast as Python does.
"""

from __future__ import annotations

import sys


def main() -> None:
    args = sys.argv[1:]
    if args[:2] == ["sandbox", "exec"]:
        from podbay.cli.quick_exec import run

        status = run(args[2:])
        if status is not None:
            sys.exit(status)
    from podbay.cli.main import main as full

    full()


if __name__ == "__main__":
    main()
