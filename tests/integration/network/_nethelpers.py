"""Helpers for the network tests: servers, probes, the test network's layout."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from podbay.domain.egress import EgressPolicy
from podbay.runtime.network.decoy import Decoy

PREFIX = "pbnt"
TMP_PREFIX = "podbay-nettest-"
#: Addresses the tests put on the host (on the host end of the veth pair).
PRIVATE_HOST_ADDRESS = "10.0.0.1"
METADATA_ADDRESS = "169.254.169.254"
PUBLIC_HOST_ADDRESS = "198.51.100.7"
#: An unprivileged host uid for probes run "as the sandbox".
PROBE_UID = 1_000_000
#: The system interpreter: the same one a Debian sandbox has, readable by PROBE_UID.
PROBE_PYTHON = shutil.which("python3", path="/usr/bin:/bin") or "/usr/bin/python3"

NEEDED_TOOLS = ("slirp4netns", "ip", "nsenter", "unshare", "setpriv", "ss", "nft", "dnsmasq")


def sh(*argv: str, check: bool = True, input: bytes | None = None) -> str:
    done = subprocess.run(argv, capture_output=True, input=input, check=False, timeout=30)
    if check and done.returncode != 0:
        raise RuntimeError(
            f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.decode().strip()}"
        )
    return done.stdout.decode()


# --------------------------------------------------------------------------- servers


class TcpServer:
    """A thread that accepts, writes a banner, counts and closes."""

    def __init__(self, host: str, banner: bytes, port: int = 0) -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, port))
        self.sock.listen(16)
        self.host = host
        self.port = self.sock.getsockname()[1]
        self.banner = banner
        self.accepted = 0
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            with contextlib.suppress(OSError), conn:
                conn.sendall(self.banner)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()


class UdpServer:
    def __init__(self, host: str) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind((host, 0))
        self.host = host
        self.port = self.sock.getsockname()[1]
        self.received = 0
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                self.sock.recvfrom(2048)
            except OSError:
                return
            self.received += 1

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()


# --------------------------------------------------------------------------- probes

#: Runs inside a namespace: argv[1] is a JSON list of [kind, host, port, payload-hex].
#: The targets are tried side by side (a thread each): a dropped packet costs
#: its timeout once per run, not once per target, which leaves room for a
#: generous TCP timeout: under gVisor a permitted connection made beside eight
#: others once took over 2 s in a full suite run.
PROBE = r"""
import errno, json, socket, sys, threading, time


def one(kind, host, port, payload):
    fam = socket.AF_INET6 if ":" in host else socket.AF_INET
    t0 = time.monotonic()
    try:
        if kind == "tcp":
            s = socket.create_connection((host, port), timeout=6)
            s.settimeout(6)
            data = s.recv(100)
            s.close()
            res = "connected:" + data.decode(errors="replace")
        else:
            s = socket.socket(fam, socket.SOCK_DGRAM)
            s.settimeout(1)
            s.connect((host, port))
            s.send(bytes.fromhex(payload))
            try:
                s.recv(2048)
                res = "answered"
            except socket.timeout:
                res = "sent-no-answer"
            s.close()
    except socket.timeout:
        res = "timeout"
    except OSError as e:
        res = errno.errorcode.get(e.errno, str(e.errno)) if e.errno else type(e).__name__
    return [res, round(time.monotonic() - t0, 3)]


targets = json.loads(sys.argv[1])
out = [None] * len(targets)


def run(i):
    out[i] = one(*targets[i])


threads = [threading.Thread(target=run, args=(i,)) for i in range(len(targets))]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(json.dumps(out))
"""


def in_netns(netns: Path, *argv: str, sandbox: bool = True) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` in ``netns``; with ``sandbox`` the way a container would be:
    an unprivileged host uid, root only inside a new user namespace."""
    prefix = ["nsenter", f"--net={netns}", "--"]
    if sandbox:
        prefix += [
            "setpriv",
            f"--reuid={PROBE_UID}",
            f"--regid={PROBE_UID}",
            "--clear-groups",
            "--",
            "unshare",
            "--user",
            "--map-root-user",
            "--",
        ]
    return subprocess.run(
        [*prefix, *argv], capture_output=True, text=True, timeout=60, check=False, cwd="/"
    )


def probe(netns: Path, targets: list[tuple[str, str, int, str]], *, sandbox: bool = True):
    """Connection attempts from inside ``netns``: [(result, seconds)] per target."""
    done = in_netns(netns, PROBE_PYTHON, "-I", "-c", PROBE, json.dumps(targets), sandbox=sandbox)
    assert done.returncode == 0, done.stderr
    return [tuple(r) for r in json.loads(done.stdout)]


# --------------------------------------------------------------------------- the test network


@dataclass
class NetLab:
    """Host changes for the session, and what they serve."""

    pid: int
    workdir: Path
    testhost_netns: Path
    testhost_address: str
    host_side_address: str
    host_link: str
    testhost_port: int = 8080
    servers: dict[str, TcpServer] = field(default_factory=dict)
    udp: UdpServer | None = None
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)


def _pid_alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


def remove_stale() -> None:
    """Undo what an earlier, killed run of these tests left (its pid is gone)."""
    for line in sh("ip", "-o", "link", "show").splitlines():
        name = line.split(":")[1].strip().split("@")[0]
        digits = name[len(PREFIX) : -1]
        if name.startswith(PREFIX) and digits.isdigit() and not _pid_alive(int(digits)):
            sh("ip", "link", "del", name, check=False)
    for entry in Path("/tmp").glob(f"{TMP_PREFIX}*"):
        digits = entry.name[len(TMP_PREFIX) :]
        if digits.isdigit() and not _pid_alive(int(digits)):
            remove_workdir(entry)


def _kill_leftovers(workdir: Path) -> None:
    """SIGKILL processes this run started under ``workdir`` and lost track of:
    anything inside one of its namespaces, and slirp4netns serving one."""
    namespaces = set()
    for path in workdir.rglob("*"):
        if _is_mount(path):
            with contextlib.suppress(OSError):
                st = os.stat(path)
                namespaces.add((st.st_dev, st.st_ino))
    prefix = f"{workdir}/".encode()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            argv = Path(f"/proc/{entry.name}/cmdline").read_bytes().split(b"\0")
            st = os.stat(f"/proc/{entry.name}/ns/net")
        except OSError:
            continue
        slirp = argv[0].endswith(b"slirp4netns") and any(a.startswith(prefix) for a in argv)
        if slirp or (st.st_dev, st.st_ino) in namespaces:
            with contextlib.suppress(OSError):
                os.kill(int(entry.name), signal.SIGKILL)


def remove_workdir(workdir: Path) -> None:
    """Stop what runs there, unmount namespace files, remove the tree (deepest first)."""
    if not workdir.exists():
        return
    _kill_leftovers(workdir)
    for path in sorted(workdir.rglob("*"), key=lambda p: len(p.parts), reverse=True):
        if _is_mount(path):
            sh("umount", "-l", str(path), check=False)
        with contextlib.suppress(OSError):
            if path.is_dir() and not path.is_symlink():
                path.rmdir()
            else:
                path.unlink()
    with contextlib.suppress(OSError):
        workdir.rmdir()


def _is_mount(path: Path) -> bool:
    target = str(path)
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == target for line in f)


def wait_listening(host: str, port: int, netns: Path | None = None) -> None:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if netns is None:
            with contextlib.suppress(OSError), socket.create_connection((host, port), 0.5):
                return
        else:
            if probe(netns, [("tcp", host, port, "")], sandbox=False)[0][0].startswith("connected"):
                return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {host}:{port}")


TESTHOST_SERVER = r"""
import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", int(sys.argv[1]))); s.listen(16)
while True:
    c, _ = s.accept(); c.sendall(sys.argv[2].encode()); c.close()
"""


def spawn_server(netns: Path, port: int, banner: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        ["nsenter", f"--net={netns}", "--", PROBE_PYTHON, "-I", "-c", TESTHOST_SERVER,
         str(port), banner],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=10)


def host_addresses() -> list[str]:
    found = []
    for entry in json.loads(sh("ip", "-j", "addr", "show")):
        for info in entry.get("addr_info", []):
            if info.get("scope") == "link" or info.get("tentative"):
                continue
            found.append(info["local"])
    return found


#: Runs inside a namespace: asks argv[2]:53 for argv[1]'s A records over UDP
#: (over TCP with a third argument "tcp"); prints [rcode, [addresses]] or
#: ["error", name].
DNS_PROBE = r"""
import json, socket, struct, sys
name, server = sys.argv[1], sys.argv[2]
tcp = sys.argv[3:] == ["tcp"]
query = struct.pack("!HHHHHH", 0x4242, 0x0100, 1, 0, 0, 0)
query += b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\0"
query += struct.pack("!HH", 1, 1)
try:
    if tcp:
        s = socket.create_connection((server, 53), timeout=3)
        s.sendall(struct.pack("!H", len(query)) + query)
        f = s.makefile("rb")
        head = f.read(2)
        if len(head) < 2:
            raise ConnectionResetError("closed")
        data = f.read(struct.unpack("!H", head)[0])
    else:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.settimeout(3)
        s.sendto(query, (server, 53))
        data = s.recv(4096)
except OSError as e:
    print(json.dumps(["error", type(e).__name__]))
    sys.exit()
count = struct.unpack("!H", data[6:8])[0]
offset, found = len(query), []
for _ in range(count):
    if data[offset] & 0xC0 == 0xC0:
        offset += 2
    else:
        while data[offset]:
            offset += data[offset] + 1
        offset += 1
    rtype, _, _, length = struct.unpack("!HHIH", data[offset : offset + 10])
    offset += 10
    if rtype == 1:
        found.append(socket.inet_ntoa(data[offset : offset + 4]))
    offset += length
print(json.dumps([data[3] & 15, found]))
"""
REFUSED_RCODE = 5


def restrictive_policies(decoy: Decoy) -> dict[str, EgressPolicy]:
    """The policies that are not open, each of which must hold every bypass:
    an allow list (the decoy's allowed address and a name), a deny list alone
    (the decoy's other address), no internet."""
    return {
        "allow list": EgressPolicy.parse({"allow": [decoy.allowed, "allowed.test"]}),
        "deny list": EgressPolicy.parse({"deny": [decoy.refused]}),
        "no internet": EgressPolicy.parse({"internet": False}),
    }
