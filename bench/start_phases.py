"""Where a ``container`` sandbox's create-to-ready goes: each step's start (+) and end (-).

Run as root with the base image cached (bench/runtime.py builds it)::

    .venv/bin/python bench/start_phases.py [--runs 10]

Wraps the OCI driver's steps (disk, record, user-namespace holder, network
and its rules, mounts, config, ``runc run``, the agent's first answer) with
timestamps, runs create + start ``--runs`` times (after one warm-up), and
prints each mark's median offset in ms from the start of ``create``, in
order. On a loaded host the steps stretch, but the order and which of the
two parallel legs (holder + network policy, disk + overlay + files) ends
last still show where the serial path is. Uses a throwaway data directory;
every sandbox is destroyed.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import functools
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from podbay.host import storage, userns
from podbay.runtime.network import manager, netns, nft, slirp
from podbay.runtime.oci import bundle, driver, runc
from podbay.settings import Settings
from runtime import destroy_all, make_driver, spec

EVENTS: list[tuple[str, float]] = []
T0 = [0.0]


def mark(name: str) -> None:
    EVENTS.append((name, (time.perf_counter() - T0[0]) * 1000))


def timed(owner: Any, attr: str, name: str) -> None:
    """Replace ``owner.attr`` (a function or coroutine function) by a timed one."""
    original: Callable[..., Any] = getattr(owner, attr)
    is_static = isinstance(owner.__dict__.get(attr), staticmethod)

    if asyncio.iscoroutinefunction(original):

        @functools.wraps(original)
        async def wrapper(*args: Any, **kwargs: Any) -> Any:
            mark(name + "+")
            try:
                return await original(*args, **kwargs)
            finally:
                mark(name + "-")

    else:

        @functools.wraps(original)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            mark(name + "+")
            try:
                return original(*args, **kwargs)
            finally:
                mark(name + "-")

    setattr(owner, attr, staticmethod(wrapper) if is_static else wrapper)


STEPS = [
    (storage, "make_disk", "disk copy"),
    (driver.OciDriver, "_save", "record"),
    (driver.OciDriver, "release", "release"),
    (userns.OwnedUserNamespace, "open", "userns holder"),
    (manager.NetworkManager, "setup", "network"),
    (manager.NetworkManager, "_teardown", "network teardown"),
    (netns, "bind", "netns bind"),
    (nft, "load", "nft load"),
    (slirp.Slirps, "start", "slirp4netns"),
    (manager.NetworkManager, "_load", "tap0 rules"),
    (driver, "_mount_storage", "disk + overlay mount"),
    (storage, "attach_loop", "loop attach"),
    (storage, "sys_mount", "mount(2)"),
    (driver.OciDriver, "_write_files", "files"),
    (bundle, "config", "config.json"),
    (runc.Runc, "run_detached", "runc run"),
    (driver, "wait_ready", "agent answers"),
]


async def main(runs: int, image_dir: str) -> None:
    for owner, attr, name in STEPS:
        timed(owner, attr, name)
    settings = Settings.load(data_dir=Path(tempfile.mkdtemp(prefix="podbay-phases-")))
    settings.runtime.image_dir = image_dir
    settings.runtime.run_dir = f"/run/podbay-bench/{uuid.uuid4().hex[:8]}"
    oci = make_driver("container", settings)
    await oci.prepare()
    offsets: dict[str, list[float]] = collections.defaultdict(list)
    try:
        for i in range(runs + 1):
            s = spec("phases")
            EVENTS.clear()
            T0[0] = time.perf_counter()
            await oci.create(s)
            mark("created")
            await oci.start(s.machine_id)
            mark("ready")
            if i:  # the first is a warm-up
                seen: collections.Counter[str] = collections.Counter()
                for name, at in EVENTS:
                    seen[name] += 1
                    offsets[name if seen[name] == 1 else f"{name} #{seen[name]}"].append(at)
            await oci.destroy(s.machine_id)
            await asyncio.sleep(0.2)
    finally:
        await destroy_all(oci)
        await oci.close()
    for name, values in sorted(offsets.items(), key=lambda kv: statistics.median(kv[1])):
        print(f"{statistics.median(values):8.1f} ms  {name}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--image-dir", default="/var/tmp/podbay-test-images")
    args = parser.parse_args()
    asyncio.run(main(args.runs, args.image_dir))
