"""The CRIU that ./run builds (podbay.host.criu) works on this host, with real runc.

What the container class's checkpoint stands on: ``criu check`` passes (Debian
12's own criu does not on this kernel), and runc checkpoints a container with a
user namespace (uid 0 mapped to 1000000+, as podbay's) and a network namespace
of that user namespace to an image directory, kills it, and
restores it from the image: its counter carries on from the next number.

The counter writes each number to a pipe of the test's: reading it is the event
waited on (runc hands the pipe over as the restored process's stdout). Nothing
here may be skipped: a host without runc, busybox or the build fails with why.
"""

from __future__ import annotations

import asyncio
import json
import os
import select
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from podbay.errors import DriverError
from podbay.host.criu import criu_env, criu_path
from podbay.runtime.oci import criu_checkpoint
from podbay.runtime.oci.runc import Runc

pytestmark = pytest.mark.root

UID_BASE = 1_000_000
ID_RANGE = 65536
#: Generous: a line comes every 50 ms; this only stops a broken run hanging.
LINE_WITHIN = 60.0
COUNTER = "i=0; while :; do i=$((i+1)); echo $i; sleep 0.05; done"


def shipped_criu() -> Path:
    if os.geteuid() != 0:
        pytest.fail("runc's checkpoint needs root")
    found = criu_path()
    if found is None:
        pytest.fail("no criu build: run `python -m podbay.host.criu_build` (./run does)")
    return found


def need(tool: str) -> str:
    found = shutil.which(tool)
    if found is None:
        pytest.fail(f"{tool} is missing on this host (./run installs it)")
    return found


def test_shipped_criu_passes_criu_check() -> None:
    checked = subprocess.run(
        [str(shipped_criu()), "check"], capture_output=True, text=True, check=False
    )
    assert checked.returncode == 0, checked.stderr
    assert "Looks good" in checked.stdout + checked.stderr


def counter_config(rootfs: Path) -> dict[str, Any]:
    """runc's default spec, made podbay-like: its own user namespace mapped to
    ``UID_BASE`` and a network namespace owned by that user namespace.

    (A network namespace that host root made, joined by path, is refused:
    ``Can't setns 10/net: Operation not permitted`` / ``One or more namespaces
    doesn't belong to the target user namespace``. podbay's own network
    namespaces are made inside the machine's user namespace: see host/userns.py.)"""
    made = subprocess.run(
        [need("runc"), "spec", "--bundle", str(rootfs.parent)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert made.returncode == 0, made.stderr
    config_file = rootfs.parent / "config.json"
    config: dict[str, Any] = json.loads(config_file.read_text())
    config_file.unlink()
    config["process"]["terminal"] = False
    config["process"]["args"] = ["/bin/sh", "-c", COUNTER]
    config["root"] = {"path": str(rootfs), "readonly": False}
    linux = config["linux"]
    linux["namespaces"] = [
        *(n for n in linux["namespaces"] if n["type"] not in ("network", "user")),
        {"type": "user"},
        {"type": "network"},
    ]
    linux["uidMappings"] = [{"containerID": 0, "hostID": UID_BASE, "size": ID_RANGE}]
    linux["gidMappings"] = [{"containerID": 0, "hostID": UID_BASE, "size": ID_RANGE}]
    # sysfs needs the user namespace to own the network namespace; a counter needs no /sys.
    config["mounts"] = [m for m in config["mounts"] if m["destination"] != "/sys"]
    return config


@pytest.fixture
def bundle() -> Iterator[Path]:
    busybox = Path("/bin/busybox")
    if not busybox.is_file():
        pytest.fail("/bin/busybox is missing (./run installs busybox-static)")
    # Not under pytest's tmp_path: its 0700 parents stop the container's mapped
    # root (uid UID_BASE on the host) from reaching its own rootfs.
    top = Path(tempfile.mkdtemp(prefix="podbay-criu-test-"))
    top.chmod(0o755)
    bundle = top / "bundle"
    rootfs = bundle / "rootfs"
    for d in ("bin", "proc", "dev", "tmp", "etc"):
        (rootfs / d).mkdir(parents=True)
    shutil.copy2(busybox, rootfs / "bin" / "busybox")
    for applet in ("sh", "sleep"):
        (rootfs / "bin" / applet).symlink_to("busybox")
    for path in [rootfs, *rootfs.rglob("*")]:
        os.lchown(path, UID_BASE, UID_BASE)
    (bundle / "config.json").write_text(json.dumps(counter_config(rootfs)))
    try:
        yield bundle
    finally:
        shutil.rmtree(top, ignore_errors=True)


class Lines:
    """Numbers read from the counter's pipe, each waited for as an event."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.buffer = b""

    def _fill(self) -> bool:
        ready, _, _ = select.select([self.fd], [], [], LINE_WITHIN)
        assert ready, f"no output from the counter within {LINE_WITHIN} s"
        chunk = os.read(self.fd, 65536)
        self.buffer += chunk
        return bool(chunk)

    def next(self) -> int:
        while b"\n" not in self.buffer:
            assert self._fill(), "the counter's pipe closed"
        line, self.buffer = self.buffer.split(b"\n", 1)
        return int(line)

    def until_closed(self) -> list[int]:
        """Every number left, up to the writer's end (the checkpoint kills it)."""
        while self._fill():
            pass
        return [int(n) for n in self.buffer.split()]

    def until_closed_text(self) -> str:
        while self._fill():
            pass
        return self.buffer.decode(errors="replace")

    def close(self) -> None:
        os.close(self.fd)


def start(argv: list[str]) -> Lines:
    """Run a detached runc command whose container writes to a new pipe of ours."""
    read, write = os.pipe()
    # runc's stderr is a pipe too: the container inherits it, CRIU dumps pipes
    # (runc hands them over again on restore) but not an unlinked host file.
    # On success nothing reads it: it stays open while the container runs.
    err_read, err_write = os.pipe()
    try:
        done = subprocess.run(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=write,
            stderr=err_write,
            env={**os.environ, **criu_env()},
            check=False,
        )
    finally:
        os.close(write)
        os.close(err_write)
    if done.returncode != 0:
        os.close(read)
        errors = Lines(err_read).until_closed_text()
        pytest.fail(f"{' '.join(argv[5:8])}... failed: {errors[-2000:]}")
    os.close(err_read)
    return Lines(read)


def test_runc_checkpoints_and_restores_a_counter_in_a_userns_container(
    bundle: Path, tmp_path: Path
) -> None:
    criu = shipped_criu()
    runc = [need("runc"), "--root", str(tmp_path / "runc"), "--criu", str(criu)]
    container = f"criu-test-{uuid.uuid4().hex[:8]}"
    images, work = tmp_path / "images", tmp_path / "work"
    images.mkdir()
    image_args = ["--image-path", str(images), "--work-path", str(work)]
    try:
        before = start([*runc, "run", "-d", "--bundle", str(bundle), container])
        seen = [before.next() for _ in range(3)]
        assert seen == [seen[0], seen[0] + 1, seen[0] + 2]

        dumped = subprocess.run(
            [*runc, "checkpoint", *image_args, container],
            capture_output=True,
            text=True,
            env={**os.environ, **criu_env()},
            check=False,
        )
        assert dumped.returncode == 0, dumped.stderr + _log(work / "dump.log")
        last = [*seen, *before.until_closed()][-1]
        before.close()
        assert (images / "inventory.img").is_file()

        after = start([*runc, "restore", "-d", *image_args, "--bundle", str(bundle), container])
        resumed = [after.next() for _ in range(3)]
        # It carries on where it stopped: the next number, not a fresh start at 1.
        assert resumed == [last + 1, last + 2, last + 3], (last, resumed)
        after.close()

        state = subprocess.run([*runc, "state", container], capture_output=True, text=True)
        assert '"running"' in state.stdout
        pid = int(state.stdout.split('"pid":')[1].split(",")[0])
        # Still in its own user namespace, uid 0 there being UID_BASE here.
        assert Path(f"/proc/{pid}/uid_map").read_text().split()[:2] == ["0", str(UID_BASE)]
    finally:
        subprocess.run([*runc, "delete", "--force", container], capture_output=True, check=False)


def _log(path: Path) -> str:
    """The errors of CRIU's log, for an assertion's message."""
    if not path.is_file():
        return ""
    return "\n".join(line for line in path.read_text().splitlines() if "Error" in line)


def test_criu_checkpoint_module_suspends_and_resumes_the_counter(
    bundle: Path, tmp_path: Path
) -> None:
    """The same through podbay.runtime.oci.criu_checkpoint, as the driver will call
    it: the images are root's alone, and the counter carries on."""
    shipped_criu()
    runc = Runc(need("runc"), tmp_path / "runc")
    container = f"criu-test-{uuid.uuid4().hex[:8]}"
    images = tmp_path / "images"
    try:
        before = start([*runc.argv("run", "-d", "--bundle", str(bundle), container)])
        last = [before.next() for _ in range(2)][-1]
        asyncio.run(criu_checkpoint.checkpoint(runc, container, images))
        last = [last, *before.until_closed()][-1]
        before.close()
        assert runc.state(container) is None  # ended: its memory is released
        assert_root_alone(images)

        read, write = os.pipe()
        null = os.open(os.devnull, os.O_RDWR)
        try:
            asyncio.run(
                criu_checkpoint.restore(
                    runc,
                    container,
                    bundle,
                    images,
                    stdio=(null, write, write),
                )
            )
        finally:
            os.close(write)
            os.close(null)
        after = Lines(read)
        assert [after.next() for _ in range(2)] == [last + 1, last + 2]
        after.close()
        assert_root_alone(images)  # handed back after the restore
    finally:
        subprocess.run([*runc.argv("delete", "--force", container)], capture_output=True)


def assert_root_alone(images: Path) -> None:
    """Nothing of a sandbox's may reach a checkpoint image: its gate is root's, 0700."""
    assert images.stat().st_uid == 0
    assert images.stat().st_mode & 0o777 == 0o700
    assert (images / criu_checkpoint.IMAGES / "inventory.img").is_file()
    assert all(p.stat().st_uid == 0 for p in (images / criu_checkpoint.IMAGES).iterdir())


def test_criu_checkpoint_failure_quotes_criu(tmp_path: Path) -> None:
    """A container that is not there: a DriverError, not a hang or a crash."""
    shipped_criu()
    runc = Runc(need("runc"), tmp_path / "runc")
    with pytest.raises(DriverError, match="checkpoint of nothing-here failed"):
        asyncio.run(criu_checkpoint.checkpoint(runc, "nothing-here", tmp_path / "images"))
