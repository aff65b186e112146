"""Starting a sandbox's network must leave the host's mounts alone.

slirp4netns --enable-sandbox detaches its old root inside a mount namespace it
copied from the node's. Where the node's mounts are shared (systemd's default
for "/"), that detach used to propagate back and unmount shared leaf mounts on
the host: every sandbox start took /dev/shm-like mounts away from other tools
(found when Docker's container roots vanished beside podbay).

The host here keeps "/" private, so the test builds a shared tree in a mount
namespace of its own and starts the network from inside it: what the node's
namespace would see on a systemd host, without touching this host's.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.root

NODE = textwrap.dedent(
    """
    import asyncio, json, os, subprocess, sys, time
    from pathlib import Path
    from podbay.runtime.network import NetworkManager

    shared, run_dir = Path(sys.argv[1]), Path(sys.argv[2])
    leaf = shared / "leaf"
    subprocess.run(["mount", "-t", "tmpfs", "podbay-shared", str(shared)], check=True)
    subprocess.run(["mount", "--make-shared", str(shared)], check=True)
    leaf.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "podbay-leaf", str(leaf)], check=True)
    before = os.path.ismount(leaf)
    manager = NetworkManager(run_dir)
    handle = asyncio.run(manager.setup("m1"))
    # slirp4netns pivots after it reports ready: give it time to do so.
    deadline = time.monotonic() + 2
    while os.path.ismount(leaf) and time.monotonic() < deadline:
        time.sleep(0.05)
    after = os.path.ismount(leaf)
    asyncio.run(manager.teardown("m1"))
    print(json.dumps({"before": before, "after": after, "slirp": handle.slirp_pid}))
    """
)


def test_a_sandbox_network_leaves_shared_host_mounts_mounted(tmp_path: Path) -> None:
    shared, run_dir = tmp_path / "shared", tmp_path / "run"
    shared.mkdir()
    # A mount namespace of the test's own ("unchanged": the copy keeps the
    # host's propagation); it and everything mounted in it end with the child.
    done = subprocess.run(
        ["unshare", "--mount", "--propagation", "unchanged", "--",
         sys.executable, "-c", NODE, str(shared), str(run_dir)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.splitlines()[-1])
    assert seen["slirp"], seen
    assert seen["before"], "the sandbox's network start unmounted a host mount"
    assert seen["after"], "the sandbox's network start unmounted a host mount"
