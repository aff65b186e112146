"""Run the two images the way the manifests do, on one machine with Docker.

    python deploy/image/smoke.py [--keep]

By hand, never in the suite (it needs a Docker daemon and the images built
from deploy/image/Dockerfile as podbay-control:0.1.0 and podbay-node:0.1.0).
It starts a throwaway PostgreSQL on this host (podbay.testing's), one control
container (unprivileged, uid 10001) and one node container (privileged, as the
DaemonSet runs it), all on the host's network, registers a deployment with the
operator CLI of this checkout, then drives the public API with the SDK: attach,
exec, a file written and read back, suspend/resume by reattach, delete. Exits 0
only if every step answered as the contract says.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

from podbay.client import SandboxClient
from podbay.testing.platform import SANDBOX_SPEC, free_port, run_cli
from podbay.testing.postgres import TemporaryCluster

CONTROL, NODE = "podbay-smoke-control", "podbay-smoke-node"


def docker(*args: str) -> str:
    done = subprocess.run(["docker", *args], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"docker {' '.join(args[:3])} …: {done.stderr.strip()}")
    return done.stdout.strip()


def env_args(env: dict[str, str]) -> list[str]:
    return [part for key, value in env.items() for part in ("-e", f"{key}={value}")]


def wait_http(url: str, what: str, seconds: float, container: str) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    logs = subprocess.run(["docker", "logs", "--tail", "30", container],
                          capture_output=True, text=True).stderr  # fmt: skip
    raise SystemExit(f"{what} did not answer {url} within {seconds:g}s:\n{logs}")


#: Capability numbers and names Docker knows (capabilities(7)), for hosts whose
#: bounding set lacks some: ``--privileged`` asks for every one and fails there.
CAPABILITIES = (  # noqa: SIM905 - capabilities(7)'s order, easier to read as text
    "CHOWN DAC_OVERRIDE DAC_READ_SEARCH FOWNER FSETID KILL SETGID SETUID SETPCAP "
    "LINUX_IMMUTABLE NET_BIND_SERVICE NET_BROADCAST NET_ADMIN NET_RAW IPC_LOCK IPC_OWNER "
    "SYS_MODULE SYS_RAWIO SYS_CHROOT SYS_PTRACE SYS_PACCT SYS_ADMIN SYS_BOOT SYS_NICE "
    "SYS_RESOURCE SYS_TIME SYS_TTY_CONFIG MKNOD LEASE AUDIT_WRITE AUDIT_CONTROL SETFCAP "
    "MAC_OVERRIDE MAC_ADMIN SYSLOG WAKE_ALARM BLOCK_SUSPEND AUDIT_READ PERFMON BPF "
    "CHECKPOINT_RESTORE"
).split()


def privileged() -> list[str]:
    """``--privileged``, or where this host cannot grant every capability (a
    machine that is itself a sandbox), what it amounts to for a node: every
    capability the host has, no seccomp or AppArmor profile, /proc and /sys
    unmasked, the host's cgroups writable, and the devices the classes use."""
    status = Path("/proc/self/status").read_text().splitlines()
    bounding = int(next(line for line in status if line.startswith("CapBnd:")).split()[1], 16)
    missing = [name for bit, name in enumerate(CAPABILITIES) if not bounding >> bit & 1]
    if not missing:
        return ["--privileged"]
    step(f"this host cannot grant {', '.join(missing)}: the node runs with every other one")
    # Device access: every device (as --privileged), the nodes from the host's /dev.
    return [
        "--cap-add=ALL", *(f"--cap-drop={name}" for name in missing),
        "--security-opt", "seccomp=unconfined", "--security-opt", "apparmor=unconfined",
        "--security-opt", "systempaths=unconfined",
        "--cgroupns=host", "-v", "/sys/fs/cgroup:/sys/fs/cgroup:rw",
        "--device-cgroup-rule=a *:* rwm",
    ]  # fmt: skip


def step(text: str) -> None:
    print(f"[smoke] {text}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keep", action="store_true", help="leave the containers running")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="podbay-smoke-"))
    db = TemporaryCluster.start()
    try:
        run(db, work)
    finally:
        if not args.keep:
            subprocess.run(["docker", "rm", "-f", CONTROL, NODE], capture_output=True)
            db.stop()


def run(db: TemporaryCluster, work: Path) -> None:
    store_url = db.create_database()
    socket_dir = parse_qs(urlparse(store_url).query)["host"][0]
    # The control image's uid 10001 must reach the socket (it holds no secret).
    os.chmod(socket_dir, 0o755)  # noqa: S103
    token = secrets.token_urlsafe(32)
    control_port, node_port = free_port(), free_port()
    control_url = f"http://127.0.0.1:{control_port}"
    shared = {"PODBAY_STORE_URL": store_url, "PODBAY_CLUSTER_ENROLLMENT_TOKEN": token}

    step(f"control container on {control_url}")
    docker("rm", "-f", CONTROL, NODE)
    docker("run", "-d", "--name", CONTROL, "--network=host",
           "-v", f"{socket_dir}:{socket_dir}",
           *env_args({**shared, "PODBAY_SERVER_PUBLIC_URL": control_url}),
           "podbay-control:0.1.0", "control", "--listen", f"127.0.0.1:{control_port}")  # fmt: skip
    wait_http(f"{control_url}/healthz", "control", 60, CONTROL)
    user = docker("exec", CONTROL, "id", "-u")
    assert user == "10001", f"control runs as uid {user}, not 10001"

    step("node container (privileged, the DaemonSet's mounts)")
    data, run_dir = work / "data", work / "run"
    data.mkdir()
    run_dir.mkdir()
    docker("run", "-d", "--name", NODE, *privileged(), "--network=host",
           "-v", f"{data}:/var/lib/podbay", "-v", f"{run_dir}:/run/podbay", "-v", "/dev:/dev",
           *env_args({**shared, "PODBAY_NODE_CONTROL_URL": control_url,
                      "PODBAY_NODE_NAME": "smoke-node",
                      "PODBAY_NODE_ADVERTISE_URL": f"http://127.0.0.1:{node_port}",
                      "PODBAY_DATA_DIR": "/var/lib/podbay",
                      "PODBAY_RUNTIME_CLASSES": "gvisor,container"}),
           "podbay-node:0.1.0", "node", "--listen", f"127.0.0.1:{node_port}")  # fmt: skip
    # A first start builds the base image (mmdebstrap): minutes.
    wait_http(f"http://127.0.0.1:{node_port}/healthz", "node", 900, NODE)
    operator = {**os.environ, **shared, "PODBAY_DATA_DIR": str(work / "operator")}
    listed = run_cli(["node", "list"], operator).stdout
    step(f"node list:\n{listed}")
    assert "smoke-node" in listed

    identity = run_cli(["deployment", "create", "smoke", "--spec", "-"], operator,
                       input=SANDBOX_SPEC).stdout.strip().splitlines()[-1]  # fmt: skip
    with SandboxClient(identity_token=identity, server_url=control_url,
                       prepare_timeout_seconds=900) as client:  # fmt: skip
        started = time.monotonic()
        handle = client.attach("smoke-1")
        step(f"attach: class {handle.class_}, endpoint {handle.endpoint}, "
             f"{time.monotonic() - started:.1f}s")  # fmt: skip
        assert handle.endpoint.startswith(f"http://127.0.0.1:{node_port}")
        done = client.exec("smoke-1", ["sh", "-c", "uname -r; id -u; echo hi"])
        step(f"exec: exit {done.exit_code}, {done.stdout.split()}")
        assert done.exit_code == 0
        assert done.stdout.split()[-1] == "hi"
        payload = secrets.token_bytes(4 << 20)
        client.write_file_bytes("smoke-1", "/tmp/payload", payload)
        back = client.read_file_bytes("smoke-1", "/tmp/payload")
        assert hashlib.sha256(back).digest() == hashlib.sha256(payload).digest()
        step("4 MiB written and read back, SHA-256 equal")
        client.delete("smoke-1")
        step("deleted")
    print("[smoke] PASS", flush=True)


if __name__ == "__main__":
    main()
