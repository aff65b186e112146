"""Docker Engine beside podbay, for ``bench/compare.py`` only: start it, stop it.

    .venv/bin/python bench/docker_setup.py start      # install, start, import the image
    .venv/bin/python bench/docker_setup.py status
    .venv/bin/python bench/docker_setup.py stop [--purge]

Never part of ``./run`` or the test suite. Made for a machine other people's
podbay tests run on (their nftables rules, network namespaces, cgroups), so
the daemon is started by hand (no systemd) and keeps to itself:

* ``--iptables=false --ip6tables=false --bridge=none --ip-forward=false
  --ip-masq=false``: it writes no firewall rule, creates no bridge and no
  veth, changes no sysctl. Its containers therefore have no network
  (``NetworkMode: none``, loopback only), which compare.py's rows do not
  need; say so beside its figures.
* its data under ``/var/lib/docker-bench`` (images, containers, and the
  containerd it starts for itself), its runtime state under
  ``/run/docker-bench``; the API on the usual ``/var/run/docker.sock`` so that
  the ``docker`` CLI finds it without flags.
* a mount namespace of its own (``unshare --mount --propagation private``):
  Docker makes its data root a *shared* mount, so every mount namespace made
  on the host afterwards holds peers of its overlay mounts, and podbay's
  slirp4netns (``--enable-sandbox``, as root: it makes ``/`` private but not
  the mounts below, then detaches the old root) propagated an unmount of
  every such leaf mount back to the host. In the host's namespace Docker's
  containers then failed to start now and then ("executable file not found":
  their root filesystem had been unmounted under them) while anyone's
  podbay sandboxes started. podbay now starts slirp4netns in a private
  namespace of its own (runtime/network/slirp.py); this stays for older
  checkouts on the machine. In its own namespace nobody else sees its
  mounts (and nobody else's namespaces pin them).
* runtimes ``runc`` (the default) and ``runsc`` (Debian's gVisor, the same
  binary podbay's gVisor class runs) with ``--platform=ptrace`` (this runsc
  predates systrap; KVM is not usable here) and ``--network=none``: with a
  network, runsc refuses to start in any network namespace of a kernel
  since 6.5 (it takes ``/proc/sys/net/core/rmem_default`` for the sign of
  the host's root namespace; podbay hides that file, Docker cannot).

The image (``podbay-base``) is podbay's own base image, the Debian root
filesystem its sandboxes run on, imported with ``docker import`` and its
ownership shifted back from podbay's sandbox uid range to 0+, so both sides
run the same files. It is built first if missing (mmdebstrap, minutes).

``stop`` removes every container, ends the daemon (and the containerd, the
shims and the sandboxes it started), and unmounts what it left; ``--purge``
also deletes ``/var/lib/docker-bench`` (the imported image, ~0.5 GiB).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import httpx

STATE = Path("/var/lib/docker-bench")
DATA_ROOT = STATE / "data"
CONFIG = STATE / "daemon.json"
LOG = STATE / "dockerd.log"
EXEC_ROOT = Path("/run/docker-bench")
PIDFILE = EXEC_ROOT / "dockerd.pid"
SOCKET = "/var/run/docker.sock"
DOCKERD = "/usr/sbin/dockerd"
#: The CLI of the same release as the daemon (a newer ``docker`` may come first on PATH).
DOCKER_CLI = "/usr/bin/docker"
RUNSC = "/usr/bin/runsc"
#: Where Docker's cgroupfs driver puts containers (its default ``cgroup-parent``, /docker).
CGROUP_PARENT = "docker"
IMAGE = "podbay-base"
#: An imported image has no environment, and runc (unlike runsc) finds no
#: command without PATH.
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
RUNSC_ARGS = ["--platform=ptrace", "--network=none"]


def daemon_config() -> dict[str, object]:
    return {
        "data-root": str(DATA_ROOT),
        "exec-root": str(EXEC_ROOT),
        "pidfile": str(PIDFILE),
        "hosts": [f"unix://{SOCKET}"],
        "iptables": False,
        "ip6tables": False,
        "ip-forward": False,
        "ip-masq": False,
        "bridge": "none",
        "userland-proxy": False,
        "storage-driver": "overlay2",
        "default-runtime": "runc",
        "runtimes": {"runsc": {"path": RUNSC, "runtimeArgs": RUNSC_ARGS}},
    }


def api() -> httpx.Client:
    return httpx.Client(
        transport=httpx.HTTPTransport(uds=SOCKET), base_url="http://docker", timeout=30
    )


def answering() -> bool:
    try:
        with api() as client:
            return client.get("/_ping").status_code == 200
    except httpx.TransportError:
        return False


def our_pid() -> int | None:
    """The dockerd this script started, if it still runs."""
    try:
        pid = int(PIDFILE.read_text())
        exe = os.readlink(f"/proc/{pid}/exe")
    except (OSError, ValueError):
        return None
    return pid if exe.endswith("dockerd") else None


def install() -> None:
    if Path(DOCKERD).exists() and Path(DOCKER_CLI).exists():
        return
    print("installing docker.io (Debian's Docker Engine 20.10)", flush=True)
    # The package would start its own dockerd (default set-up: iptables rules,
    # a bridge) unless policy-rc.d forbids starting services, as it does on
    # these machines; where it does not, one forbids it for the install.
    policy = Path("/usr/sbin/policy-rc.d")
    made = not policy.exists()
    if made:
        policy.write_text("#!/bin/sh\nexit 101\n")
        policy.chmod(0o755)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    argv = ["apt-get", "install", "-y", "-q", "--no-install-recommends", "docker.io"]
    try:
        if subprocess.run(argv, env=env).returncode != 0:
            subprocess.run(["apt-get", "update", "-q"], check=True, env=env)  # stale lists
            subprocess.run(argv, check=True, env=env)
    finally:
        if made:
            policy.unlink()


def start_daemon() -> None:
    if answering():
        if our_pid() is None:
            sys.exit(f"another Docker daemon answers on {SOCKET}: not starting a second one")
        print(f"dockerd already running (pid {our_pid()})")
        return
    STATE.mkdir(parents=True, exist_ok=True)
    EXEC_ROOT.mkdir(parents=True, exist_ok=True)
    CONFIG.write_text(json.dumps(daemon_config(), indent=2) + "\n")
    with open(LOG, "ab") as log:
        # A mount namespace of its own: see the module's doc.
        alone = ["unshare", "--mount", "--propagation", "private", "--"]
        proc = subprocess.Popen(
            [*alone, DOCKERD, "--config-file", str(CONFIG)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,  # outlives this script; ``stop`` ends it
        )
    deadline = time.monotonic() + 60
    while not answering():
        if proc.poll() is not None or time.monotonic() > deadline:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            sys.exit(f"dockerd did not come up; see {LOG}:\n{tail(LOG)}")
        time.sleep(0.2)
    print(f"dockerd running (pid {proc.pid}), data {DATA_ROOT}, log {LOG}")


def tail(path: Path, lines: int = 20) -> str:
    with contextlib.suppress(OSError):
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    return ""


def podbay_rootfs() -> tuple[Path, int]:
    """podbay's base image (the one ``podbay.testing`` servers share), built if
    missing, and the uid its ownership is shifted by."""
    from podbay.host.image import ImageCache
    from podbay.runtime.oci.driver import OciDriver
    from podbay.settings import Settings
    from podbay.testing.fixtures import DEFAULT_IMAGE_DIR

    image_dir = os.environ.get("PODBAY_TEST_IMAGE_DIR", DEFAULT_IMAGE_DIR)
    with tempfile.TemporaryDirectory(prefix="docker-bench-") as data_dir:
        settings = Settings.load(
            environ={"PODBAY_RUNTIME_IMAGE_DIR": image_dir}, data_dir=Path(data_dir)
        )
        driver = OciDriver(settings)
        cache = ImageCache(driver.layout.image_dir, driver.recipe)
        if cache.cached() is None:
            print(f"building podbay's base image in {image_dir} (mmdebstrap, minutes)", flush=True)
        image = asyncio.run(cache.ensure())
    return image.rootfs, driver.recipe.uid_base


def import_image(rootfs: Path, uid_base: int) -> None:
    """``docker import`` of ``rootfs`` with owners shifted back by ``uid_base``."""

    def unshift(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.uid = info.uid - uid_base if info.uid >= uid_base else info.uid
        info.gid = info.gid - uid_base if info.gid >= uid_base else info.gid
        info.uname = info.gname = ""
        return info

    print(f"importing {rootfs} as {IMAGE}", flush=True)
    proc = subprocess.Popen(
        [DOCKER_CLI, "import", "-c", "WORKDIR /", "-c", f"ENV PATH={PATH}", "-", IMAGE],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
    )
    assert proc.stdin is not None
    with tarfile.open(fileobj=proc.stdin, mode="w|", format=tarfile.PAX_FORMAT) as tar:
        for entry in sorted(os.listdir(rootfs)):
            tar.add(rootfs / entry, arcname=entry, filter=unshift)
    proc.stdin.close()
    if proc.wait() != 0:
        sys.exit("docker import failed")


def check_runtimes() -> None:
    """One ``docker run`` per runtime: the set-up is proved before a benchmark
    depends on it."""
    for runtime in ("runc", "runsc"):
        run = [DOCKER_CLI, "run", "--rm", "--network=none", f"--runtime={runtime}", IMAGE]
        done = subprocess.run(
            [*run, "echo", f"hello from {runtime}"],
            capture_output=True,
            text=True,
            timeout=120,
            stdin=subprocess.DEVNULL,
        )
        status = done.stdout.strip() if done.returncode == 0 else f"FAILED: {done.stderr.strip()}"
        print(f"  {runtime}: {status}")


def start(args: argparse.Namespace) -> None:
    install()
    start_daemon()
    with api() as client:
        present = client.get(f"/images/{IMAGE}/json").status_code == 200
    if not present or args.reimport:
        rootfs, uid_base = (Path(args.rootfs), args.uid_base) if args.rootfs else podbay_rootfs()
        import_image(rootfs, uid_base)
    check_runtimes()


def our_processes() -> list[int]:
    """Processes of this daemon's making: containerd, shims, runsc, container
    processes are found through the shims' and containerd's command lines."""
    marks = (str(EXEC_ROOT), str(DATA_ROOT))
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry.name}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if any(m in argv for m in marks):
            found.append(int(entry.name))
    return found


def our_mounts(pid: int | str = "self") -> list[str]:
    """Docker's mounts seen by ``pid`` (the daemon's own namespace, or this one:
    none unless a daemon ran outside a namespace of its own)."""
    marks = (str(EXEC_ROOT), str(DATA_ROOT))
    points = []
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/mountinfo").read_text().splitlines():
            point = line.split()[4]
            if point.startswith(marks):
                points.append(point)
    return sorted(points, key=len, reverse=True)  # deepest first


def remove_cgroups() -> None:
    """Docker's cgroups (``docker/<id>`` in each hierarchy, cgroupfs driver): a
    container whose start failed, or a daemon that was killed, leaves them
    behind; any process still in one is a container's and is ended first."""
    for top in Path("/sys/fs/cgroup").glob(f"*/{CGROUP_PARENT}"):
        tree = sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: len(p.parts))
        for group in [top, *tree]:
            with contextlib.suppress(OSError):
                for pid in (group / "cgroup.procs").read_text().split():
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(int(pid), signal.SIGKILL)
        for group in [*reversed(tree), top]:  # deepest first
            for _ in range(50):
                try:
                    group.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.1)  # killed processes leave the group a moment later


def stop(args: argparse.Namespace) -> None:
    pid = our_pid()
    if pid is None and answering():
        sys.exit(f"the Docker daemon on {SOCKET} is not this script's: leaving it alone")
    if pid is not None:
        with api() as client:
            for c in client.get("/containers/json", params={"all": "true"}).json():
                client.delete(f"/containers/{c['Id']}", params={"force": "true"})
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 60
        while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        if Path(f"/proc/{pid}").exists():
            os.kill(pid, signal.SIGKILL)
        print(f"dockerd (pid {pid}) stopped")
    # Shims and runsc sandboxes outlive a killed daemon: end what is left.
    for left in our_processes():
        with contextlib.suppress(ProcessLookupError):
            os.kill(left, signal.SIGKILL)
            print(f"killed leftover process {left}")
    for point in our_mounts():
        subprocess.run(["umount", "-l", point], check=False)
    remove_cgroups()
    with contextlib.suppress(FileNotFoundError):
        os.unlink(SOCKET)
    shutil.rmtree(EXEC_ROOT, ignore_errors=True)
    if args.purge:
        shutil.rmtree(STATE, ignore_errors=True)
        print(f"removed {STATE}")


def status(_: argparse.Namespace) -> None:
    pid = our_pid()
    print(f"dockerd: {'pid ' + str(pid) if pid else 'not running (this script)'}")
    print(f"API on {SOCKET}: {'answers' if answering() else 'no answer'}")
    print(f"processes of ours: {len(our_processes())}")
    if pid:
        print(f"mounts in its namespace: {len(our_mounts(pid))}")
    print(f"its mounts in this namespace: {len(our_mounts())} (0 expected)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("start", help="install docker.io if missing, start dockerd, import")
    p.add_argument("--rootfs", help="import this root filesystem instead of podbay's base image")
    p.add_argument("--uid-base", type=int, default=0, help="with --rootfs: its uid shift")
    p.add_argument("--reimport", action="store_true", help="import the image again")
    p.set_defaults(fn=start)
    p = sub.add_parser("stop", help="remove the containers, stop dockerd, leave nothing running")
    p.add_argument("--purge", action="store_true", help=f"also delete {STATE}")
    p.set_defaults(fn=stop)
    sub.add_parser("status").set_defaults(fn=status)
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root")
    args.fn(args)


if __name__ == "__main__":
    main()
