"""No process the server starts holds a descriptor of the server's it does not
need: not its listening socket (a QEMU that held it kept the port after the
server died), nor its other sockets, its database or its log. Every class,
with a real server: each process's descriptors are read from /proc."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from podbay.testing.platform import PlatformServer

# The vm class is proved under TCG after start: minutes on a busy machine.
pytestmark = [pytest.mark.root, pytest.mark.timeout(900)]

CLASSES = ("gvisor", "container", "vm")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PlatformServer]:
    with PlatformServer.start(
        tmp_path_factory.mktemp("descriptors"),
        env={
            "PODBAY_RUNTIME_CLASSES": ",".join(CLASSES),
            "PODBAY_RUNTIME_MEMORY_BYTES": str(512 << 20),
        },
    ) as s:
        yield s


def _wait_for_classes(server: PlatformServer, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while True:
        health = server.http.get("/healthz").json()
        if set(CLASSES) <= set(health["classes"]["available"]):
            return
        assert time.monotonic() < deadline, f"classes never all available: {health}"
        time.sleep(0.5)


def _descriptors(pid: int) -> dict[int, str]:
    """``/proc/PID/fd``: each descriptor's target (readlink); {} for a process gone."""
    found = {}
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return {}
    for name in names:
        try:
            found[int(name)] = os.readlink(f"/proc/{pid}/fd/{name}")
        except OSError:
            continue  # closed meanwhile
    return found


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _server_owned(server: PlatformServer) -> set[str]:
    """What the server holds that no child needs: its sockets (the listening one
    first of all), and its files: the database, the log."""
    assert server.process is not None
    owned = set()
    for target in _descriptors(server.process.pid).values():
        if target.startswith("socket:"):
            owned.add(target)
        elif target.startswith("/") and not target.startswith("/dev/"):
            path = Path(target)
            if path.is_relative_to(server.data_dir) or path == server.log_path:
                owned.add(target)
    return owned


def _holders(server: PlatformServer) -> dict[str, list[str]]:
    """Every other process on the host holding one of the server's own
    descriptors (daemonised children, QEMU and runsc, are no longer its
    descendants: all of /proc is read)."""
    assert server.process is not None
    owned = _server_owned(server)
    held: dict[str, list[str]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) in (server.process.pid, os.getpid()):
            continue
        shared = sorted(set(_descriptors(int(entry)).values()) & owned)
        if shared:
            held[f"{entry} {_cmdline(int(entry))[:200]}"] = shared
    return held


def _sandbox_processes(server: PlatformServer) -> list[str]:
    """The command lines of the sandboxes' host processes (named by its run directory)."""
    return [
        _cmdline(int(p))
        for p in os.listdir("/proc")
        if p.isdigit() and server.run_dir in _cmdline(int(p))
    ]


def test_no_child_holds_a_server_descriptor(server):
    _wait_for_classes(server)
    token = server.create_deployment("fds")
    for sandbox_class in CLASSES:
        r = server.attach(token, sandbox_class, json={"class": sandbox_class})
        assert r.status_code == 200, r.text
        assert server.exec(r.json(), "true").json()["exit_code"] == 0
    assert server.process is not None
    listening = _descriptors(server.process.pid)[_listening_fd(server)]
    assert listening in _server_owned(server)  # what matters most is looked for
    commands = " ".join(_sandbox_processes(server))
    for program in ("qemu-system", "runsc", "slirp4netns"):
        assert program in commands, commands  # each class's processes were looked at
    assert _holders(server) == {}


def _listening_fd(server: PlatformServer) -> int:
    """The server's descriptor of its listening socket (by its inode in /proc/net/tcp)."""
    assert server.process is not None
    inodes = set()
    with open(f"/proc/{server.process.pid}/net/tcp") as table:
        for line in table.read().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and int(fields[1].split(":")[1], 16) == server.port:
                inodes.add(f"socket:[{fields[9]}]")
    for fd, target in _descriptors(server.process.pid).items():
        if target in inodes:
            return fd
    raise AssertionError("the server holds no socket listening on its port")


def test_after_kill9_a_new_server_listens_on_the_port_while_a_vm_lives(server):
    _wait_for_classes(server)
    token = server.create_deployment("port-again")
    r = server.attach(token, "lives", json={"class": "vm"})
    assert r.status_code == 200, r.text
    server.kill9()
    assert any("qemu-system" in c for c in _sandbox_processes(server))  # the vm lives on
    server.spawn()
    server.wait_ready()  # failed: "cannot listen on ...: Address already in use"
    _wait_for_classes(server)
    again = server.attach(token, "lives", json={"class": "vm"}).json()
    assert again["start"] == "reused"
    assert server.exec(again, "true").json()["exit_code"] == 0
