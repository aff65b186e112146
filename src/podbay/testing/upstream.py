"""A test host standing in for the internet: a network namespace joined to this
host by a veth pair, with public-looking addresses, serving a banner over TCP.

Sandboxes reach it as they reach any internet address (through slirp4netns,
so through the host's routing), which lets egress tests see a policy refuse
or let through a real connection without leaving the machine. Needs root.

    with upstream(workdir, "pbth1234h", "192.0.2.8/29") as host:
        host.addresses  # ('192.0.2.10', '192.0.2.11', ...): the same server
        host.port       # a connection there reads host.banner

Every change is named after the caller (``link``) and undone on exit; the
caller puts its process id in ``link`` so that :func:`remove_stale_links`
can undo what a killed run left.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Upstream", "own_slot", "own_subnet", "remove_stale_links", "upstream"]

#: The system interpreter, which the server runs on inside the namespace.
PYTHON = shutil.which("python3", path="/usr/bin:/bin") or "/usr/bin/python3"

SERVER = r"""
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", int(sys.argv[1]))); s.listen(16)
while True:
    c, _ = s.accept(); c.sendall(sys.argv[2].encode()); c.close()
"""


@dataclass(frozen=True)
class Upstream:
    netns: Path
    #: Its addresses, all served by the one server: a test allows one and
    #: expects another refused (the same host, so only the policy differs).
    addresses: tuple[str, ...]
    #: This host's end of the link (a host address: sandboxes never reach it).
    host_side_address: str
    link: str
    port: int
    banner: str

    @property
    def address(self) -> str:
        return self.addresses[0]


def _sh(*argv: str, check: bool = True) -> str:
    done = subprocess.run(argv, capture_output=True, check=False, timeout=30)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed: {done.stderr.decode().strip()}")
    return done.stdout.decode()


@contextlib.contextmanager
def upstream(
    workdir: Path, link: str, subnet: str, *, port: int = 8080, banner: str = "testhost\n"
) -> Iterator[Upstream]:
    """The test host on ``subnet``: its first address is this host's end of
    ``link``, the others the test host's. Undone on exit, even half made."""
    net = ipaddress.IPv4Network(subnet)
    first, *rest = (str(a) for a in net.hosts())
    netns = workdir / f"{link}.netns"
    peer = link[:-1] + "t"
    server: subprocess.Popen[bytes] | None = None
    inside = ["nsenter", f"--net={netns}", "--", "ip"]
    try:
        netns.touch()
        _sh("unshare", f"--net={netns}", "true")
        _sh("ip", "link", "add", link, "type", "veth", "peer", "name", peer)
        _sh("ip", "link", "set", peer, "netns", str(netns))
        _sh("ip", "addr", "add", f"{first}/{net.prefixlen}", "dev", link)
        _sh("ip", "link", "set", link, "up")
        _sh(*inside, "link", "set", "lo", "up")
        _sh(*inside, "link", "set", peer, "name", "eth0")
        for address in rest:
            _sh(*inside, "addr", "add", f"{address}/{net.prefixlen}", "dev", "eth0")
        _sh(*inside, "link", "set", "eth0", "up")
        _sh(*inside, "route", "add", "default", "via", first)
        server = subprocess.Popen(
            ["nsenter", f"--net={netns}", "--", PYTHON, "-I", "-c", SERVER, str(port), banner],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        host = Upstream(netns, tuple(rest), first, link, port, banner)
        _wait_listening(host)
        yield host
    finally:
        if server is not None:
            server.kill()
            server.wait(timeout=10)
        _sh("ip", "link", "del", link, check=False)
        if netns.exists():
            _sh("umount", "-l", str(netns), check=False)
            netns.unlink()


def _wait_listening(host: Upstream) -> None:
    """Connections from this host (the positive control) reach every address."""
    deadline = time.monotonic() + 10
    for address in host.addresses:
        while True:
            with contextlib.suppress(OSError), socket.create_connection((address, host.port), 0.5):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"the test host does not answer on {address}:{host.port}")
            time.sleep(0.05)


def remove_stale_links(prefix: str) -> None:
    """Delete links ``<prefix><pid>h`` whose process is gone (a killed run)."""
    for line in _sh("ip", "-o", "link", "show").splitlines():
        name = line.split(":")[1].strip().split("@")[0]
        digits = name[len(prefix) : -1]
        if name.startswith(prefix) and digits.isdigit() and not Path(f"/proc/{digits}").exists():
            _sh("ip", "link", "del", name, check=False)


def own_slot(count: int, pid: int | None = None) -> int:
    """One of ``count`` slots (an even number) for this test process: chosen by
    the process id, so two runs side by side most likely differ, and by the
    pytest-xdist worker (``gw0``, ``gw1``: even slots for one, odd for the
    other), so the two workers of one run (``./run test``) always differ."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw")
    parity = int(worker) % 2 if worker.isdigit() else 0
    return 2 * ((os.getpid() if pid is None else pid) % (count // 2)) + parity


def own_subnet(base: str, pid: int | None = None) -> str:
    """A /29 of the /24 ``base`` (``192.0.2.0``) of this test process's own
    (:func:`own_slot`)."""
    prefix = base.rsplit(".", 1)[0]
    return f"{prefix}.{8 * own_slot(32, pid)}/29"
