"""Checkpoint to disk for the OCI driver: the image, its digest, the agent's park.

A checkpointed machine's memory and processes are an image in its data area,
``<machine home>/checkpoint/`` (mode 0700, root's; the home holds the
machine's disk file and record, and nothing of it is bound into any sandbox),
and a manifest beside it, ``checkpoint.json``, with each image file's size and
sha256, written (fsync'd, one rename) only once the image is complete. A
machine with a manifest and no running container *is* suspended: that
survives a restart of the server and a reboot of the host (the run directory,
cgroup and network namespace all gone). Before a restore every file is hashed
again; a file changed, added or missing refuses the restore
(:class:`DriverError`) and leaves the machine suspended as it was.

gVisor cannot save a unix socket bound on the host, which the agent's socket
is (see :mod:`podbay.agent.park`): the host parks the agent first
(:func:`park_agent`), and a restored agent binds its socket again once
:data:`RESUMED` appears in its socket directory.

runsc's ``checkpoint``/``restore`` are what is used today; runc's (CRIU) can
be added beside them with the same image directory and manifest.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import socket
from dataclasses import dataclass
from pathlib import Path

from podbay.errors import ParkRefused as ParkRefused  # raised here; defined in the one tree
from podbay.host import storage

from ..base import DriverError

#: The image directory and its manifest, in the machine's home.
IMAGE_DIR = "checkpoint"
MANIFEST = "checkpoint.json"
#: The file that ends the agent's park (the same name as podbay.agent.park.RESUMED,
#: which the sandbox's side reads; a unit test keeps the two equal).
RESUMED = "resumed"
#: The file the parked agent makes there once it holds no host socket
#: (podbay.agent.park.PARKED).
PARKED = "parked"
#: How often the host looks for :data:`PARKED`.
PARKED_POLL_S = 0.005
#: The agent's route that parks it (podbay.wire.paths.PARK).
PARK_PATH = "/v1/park"
#: How long the agent may take to close its connections after a park.
PARK_TIMEOUT_S = 10.0

_CHUNK = 1 << 20


@dataclass(frozen=True)
class Sealed:
    """A complete image: its files' sizes and digests."""

    files: dict[str, tuple[int, str]]

    @property
    def bytes(self) -> int:
        return sum(size for size, _ in self.files.values())


def image_dir(home: Path) -> Path:
    return home / IMAGE_DIR


def manifest_path(home: Path) -> Path:
    return home / MANIFEST


def fresh_image_dir(home: Path) -> Path:
    """An empty image directory (an old image and manifest removed), 0700 and root's."""
    discard(home)
    target = image_dir(home)
    target.mkdir(mode=0o700)
    os.chown(target, 0, 0)
    os.chmod(target, 0o700)  # whatever the umask
    return target


def sealed(home: Path) -> bool:
    """A complete image is there (its manifest written)."""
    return manifest_path(home).is_file()


def seal(home: Path) -> Sealed:
    """Hash the image's files and write the manifest (fsync'd, one rename)."""
    found = _hash_all(image_dir(home))
    if not found:
        raise DriverError("the checkpoint wrote no image file")
    manifest = manifest_path(home)
    tmp = manifest.with_name(f".{manifest.name}.{os.getpid()}")
    body = {"files": {name: {"bytes": s, "sha256": d} for name, (s, d) in found.items()}}
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, json.dumps(body, sort_keys=True).encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, manifest)
    _fsync_dir(home)
    return Sealed(found)


def verify(home: Path) -> Sealed:
    """The manifest's image, every file hashed again; :class:`DriverError` when
    any differs, is missing or was added (nothing is changed then)."""
    try:
        raw = json.loads(manifest_path(home).read_text())
        expected = {
            str(name): (int(entry["bytes"]), str(entry["sha256"]))
            for name, entry in raw["files"].items()
        }
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise DriverError(f"checkpoint manifest unreadable: {exc}") from None
    try:
        found = _hash_all(image_dir(home))
    except OSError as exc:
        raise DriverError(f"checkpoint image unreadable: {exc}") from None
    if found != expected:
        changed = sorted(set(found) ^ set(expected)) or sorted(
            name for name in expected if found.get(name) != expected[name]
        )
        raise DriverError(
            f"checkpoint image does not match its digest ({', '.join(changed)}): "
            "refusing to restore it"
        )
    return Sealed(found)


def discard(home: Path) -> None:
    """Remove the image and its manifest (the manifest first: no half image is
    ever taken for a complete one)."""
    manifest_path(home).unlink(missing_ok=True)
    storage.remove_tree(image_dir(home))


def _hash_all(directory: Path) -> dict[str, tuple[int, str]]:
    found: dict[str, tuple[int, str]] = {}
    for entry in sorted(directory.iterdir()):
        if not entry.is_file() or entry.is_symlink():
            raise OSError(f"{entry.name} is not a regular file")
        digest = hashlib.sha256()
        size = 0
        with entry.open("rb") as f:
            while chunk := f.read(_CHUNK):
                digest.update(chunk)
                size += len(chunk)
        found[entry.name] = (size, digest.hexdigest())
    return found


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


async def park_agent(socket_path: Path, socket_dir: Path, within: float = PARK_TIMEOUT_S) -> None:
    """Ask the agent to let go of its host sockets and wait until it says it
    holds none (:data:`PARKED` in ``socket_dir``). A refusal, a closed socket
    or no word in time is a :class:`DriverError`."""
    parked = socket_dir / PARKED
    parked.unlink(missing_ok=True)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within
    try:
        await asyncio.wait_for(asyncio.to_thread(_park, socket_path), within)
    except TimeoutError:
        raise DriverError("the agent did not answer the park in time") from None
    while not os.path.lexists(parked):  # noqa: ASYNC240 - one lstat on tmpfs
        if loop.time() > deadline:
            raise DriverError(f"the agent did not park within {within:.0f} s")
        await asyncio.sleep(PARKED_POLL_S)
    parked.unlink(missing_ok=True)


def _park(socket_path: Path) -> None:
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(PARK_TIMEOUT_S)
            conn.connect(str(socket_path))
            conn.sendall(
                f"POST {PARK_PATH} HTTP/1.1\r\nHost: agent\r\nConnection: close\r\n"
                "Content-Length: 0\r\n\r\n".encode()
            )
            answer = b""
            with contextlib.suppress(ConnectionResetError):
                while chunk := conn.recv(4096):
                    answer += chunk
    except OSError as exc:
        raise ParkRefused(f"the agent could not be parked: {exc}") from None
    status = answer.split(b" ", 2)[1:2]
    if status and status[0] != b"202":
        raise ParkRefused(f"the agent refused to park: {answer[:300]!r}")
