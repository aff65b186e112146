"""The first exec after a sandbox idled past its agent's hibernation delay,
beside its second, for one checkout (run it once per checkout, in turns).

Run as root from a checkout, with ``PYTHONPATH`` at the ``src`` to measure::

    PYTHONPATH=src .venv/bin/python bench/wake_exec.py [--class gvisor] [--rounds 6]

One ``podbay serve`` (no warm pool, hibernation after compare.py's
``HIBERNATE_SECONDS``), one sandbox. Each round: an exec, a pause past the
delay, then a new client (a kept connection would meet the server's 5-s
keep-alive closing it, and the pause is as long) attaches, and its first and
second execs of ``true`` are timed; ``python -I -S -c pass`` after, as the
machine's floor. Prints each round's first exec and the medians.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time

from compare import HIBERNATE_SECONDS, Podbay, timed
from podbay import SandboxClient


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--class", dest="klass", default="gvisor")
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    side = Podbay(warm_pool=0, klass=args.klass)
    try:
        name = "sleeper"
        side.client.attach(name)
        firsts, seconds, floors = [], [], []
        floor = [sys.executable, "-I", "-S", "-c", "pass"]
        for _ in range(args.rounds):
            side.client.exec(name, ["true"])
            time.sleep(HIBERNATE_SECONDS + 2)
            with SandboxClient(identity_token=side.token, server_url=side.server.base_url) as c:
                c.attach(name)  # the control plane's part, not timed
                firsts.append(timed(lambda c=c: c.exec(name, ["true"])) * 1000)
                seconds.append(timed(lambda c=c: c.exec(name, ["true"])) * 1000)
            floors.append(timed(lambda: subprocess.run(floor, check=True)) * 1000)
        print("first exec after idling, each round (ms):", [round(x) for x in firsts])
        print(f"first exec median {statistics.median(firsts):.1f} ms")
        print(f"second exec median {statistics.median(seconds):.1f} ms")
        print(f"python -I -S -c pass median {statistics.median(floors):.1f} ms")
    finally:
        side.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
