"""A sandbox started before the host gained an address must not reach it there.

The policy refuses every address the host has. A warm (pooled) sandbox had its
rules loaded when it started; an address the host gained afterwards used to be
reachable from it until something reloaded them. This adds an address to the
host after the sandbox is up, with a server on it, and expects the sandbox's
rules to take it in and its connection to be refused, under runc and runsc.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from podbay.settings import Settings
from podbay.testing.fixtures import (
    OCI_RUNTIMES,
    DriverSession,
    Machines,
    session_for,
    settings_for,
)
from podbay.testing.upstream import own_slot

pytestmark = pytest.mark.root

#: Documentation range, not in the policy's fixed ranges: only "it is the host's"
#: can make the sandbox refuse it. One per test process.
NEW_ADDRESS = f"198.51.100.{200 + own_slot(50)}"
LINK = f"pbst{os.getpid()}"

CONNECT = r"""
import json, socket, sys
host, port = sys.argv[1], int(sys.argv[2])
try:
    socket.create_connection((host, port), timeout=3).close()
    print(json.dumps("connected"))
except OSError as e:
    print(json.dumps(type(e).__name__))
"""


@pytest.fixture(scope="module", params=OCI_RUNTIMES)
def oci_settings(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Settings]:
    yield from settings_for(tmp_path_factory, request.param)


@pytest.fixture(scope="module")
def oci_session(oci_settings: Settings) -> Iterator[DriverSession]:
    yield from session_for(oci_settings)


class Server:
    """Accepts on ``address`` in a thread and counts."""

    def __init__(self, address: str) -> None:
        self.sock = socket.create_server((address, 0))
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            conn.close()


@contextlib.contextmanager
def gained_address() -> Iterator[str]:
    """An address the host gains now (on a veth pair of this test's own)."""
    subprocess.run(["ip", "link", "del", LINK], capture_output=True, check=False)
    subprocess.run(
        ["ip", "link", "add", LINK, "type", "veth", "peer", "name", f"{LINK}p"], check=True
    )
    try:
        subprocess.run(["ip", "addr", "add", f"{NEW_ADDRESS}/32", "dev", LINK], check=True)
        for link in (LINK, f"{LINK}p"):
            subprocess.run(["ip", "link", "set", link, "up"], check=True)
        yield NEW_ADDRESS
    finally:
        subprocess.run(["ip", "link", "del", LINK], capture_output=True, check=False)


def blocked_in_rules(netns: Path, address: str) -> bool:
    listed = subprocess.run(
        ["nsenter", f"--net={netns}", "nft", "-j", "list", "set", "inet", "podbay", "blocked_v4"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    return address in listed


def test_an_address_gained_after_start_is_refused(
    oci_machines: Machines, oci_session: DriverSession
) -> None:
    warm = oci_machines.up()  # rules loaded now, before the host has the address
    netns = Path(oci_session.settings.runtime.run_dir) / warm.id / "netns"
    assert not blocked_in_rules(netns, NEW_ADDRESS)
    with gained_address() as address:
        server = Server(address)
        try:
            deadline = time.monotonic() + 10
            while not blocked_in_rules(netns, address):
                assert time.monotonic() < deadline, "the running sandbox's rules went stale"
                # The driver lives on this loop (as in the server): let it run.
                oci_session.run(asyncio.sleep(0.1))
            done = warm.agent.exec(
                ["python3", "-c", CONNECT, address, str(server.port)], timeout_ms=20_000
            )
            assert done.ok, done.stderr
            assert json.loads(done.stdout) in ("ConnectionRefusedError", "TimeoutError")
            assert server.accepted == 0
        finally:
            server.sock.close()
