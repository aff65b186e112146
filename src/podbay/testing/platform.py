"""A real ``podbay serve`` in a subprocess, for end-to-end tests and benchmarks
(``role="control"`` or ``"node"`` runs that role instead: see
:mod:`podbay.testing.local_cluster`).

Reusable by any suite (the SDK's included)::

    from podbay.testing.platform import PlatformServer

    with PlatformServer.start(tmp_path, env={"PODBAY_LIFECYCLE_IDLE_SECONDS": "2"}) as server:
        token = server.create_deployment("agent")
        handle = server.attach(token, "thread-1").json()

The server uses the shared base-image cache of :mod:`podbay.testing.fixtures`
(built once per machine), its own data and run directories, and a fixed
port, so :meth:`PlatformServer.restart` comes back at the same URL. On
:meth:`close` every machine of its data directory is destroyed.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

from .fixtures import DEFAULT_IMAGE_DIR, require_host

SANDBOX_SPEC = "name: test-agent\nsandbox:\n  toolchain: never\n"
NO_SANDBOX_SPEC = "name: test-agent\n"
#: numpy, Pillow and matplotlib in the sandbox, for suites whose sandbox code uses
#: them (run_code's figures; smolagents' remote side imports numpy and PIL): one
#: section, so one layer serves them all (with ``shared_layer_dir``, built once
#: per machine). Prefix it with a ``name:`` line.
PYDATA_SECTION = """\
sandbox:
  toolchain: never
  python:
    packages: ["matplotlib==3.9.2", "numpy==2.1.3", "pillow==11.0.0"]
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_cli(
    args: list[str],
    env: dict[str, str],
    input: str | None = None,
    check: bool = True,
    timeout: float = 60,
) -> subprocess.CompletedProcess[str]:
    """``podbay ARGS`` as a process of its own, with ``env``; its output as text.
    ``check``: RuntimeError with its stderr when it fails."""
    result = subprocess.run(
        [sys.executable, "-m", "podbay.cli.main", *args],
        env=env,
        input=input,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if check and result.returncode != 0:
        raise RuntimeError(f"podbay {' '.join(args)} failed: {result.stderr}")
    return result


class PlatformServer:
    def __init__(
        self,
        root: Path,
        env: dict[str, str],
        port: int,
        role: str = "serve",
        data_dir: Path | None = None,
    ) -> None:
        self.root = root
        self.role = role
        self.data_dir = data_dir or root / "data"
        self.port = port
        self.base_url = f"http://127.0.0.1:{port}"
        self.run_dir = f"/run/podbay-test/{uuid.uuid4().hex[:8]}"
        self.env = {
            **os.environ,
            "PODBAY_RUNTIME_IMAGE_DIR": os.environ.get("PODBAY_TEST_IMAGE_DIR", DEFAULT_IMAGE_DIR),
            "PODBAY_RUNTIME_RUN_DIR": self.run_dir,
            "PODBAY_RUNTIME_WARM_POOL": "0",
            # runc unless a test asks for more: the platform's behaviour is the
            # same in every class, and the class tests name theirs.
            "PODBAY_RUNTIME_CLASSES": "container",
            **env,
        }
        self.process: subprocess.Popen[bytes] | None = None
        self.http = httpx.Client(base_url=self.base_url, timeout=60)
        self.log_path = root / f"{role}.log"

    # -- life of the server process ------------------------------------------------
    @classmethod
    def start(
        cls,
        root: Path,
        *,
        env: dict[str, str] | None = None,
        wait: bool = True,
        role: str = "serve",
        port: int | None = None,
        data_dir: Path | None = None,
    ) -> PlatformServer:
        require_host()
        root.mkdir(parents=True, exist_ok=True)
        server = cls(root, env or {}, port or free_port(), role, data_dir)
        server.spawn()
        if wait:
            try:
                server.wait_ready()
            except BaseException:
                # Not handed to a ``with``: a server that did not come up (a vm
                # class that timed out on a loaded host) is stopped here, or it
                # outlives the test run.
                server.close()
                raise
        return server

    def spawn(self) -> None:
        log = open(self.log_path, "ab")  # noqa: SIM115 - owned by the child
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "podbay.cli.main",
                self.role,
                "--data-dir",
                str(self.data_dir),
                "--listen",
                f"127.0.0.1:{self.port}",
            ],
            env=self.env,
            stdout=log,
            stderr=log,
            start_new_session=True,
        )
        log.close()

    def wait_classes(self, *names: str, within: float = 600.0) -> None:
        """Until every class in ``names`` is available (its proof, a vm guest's
        boot under TCG included, has passed); ``AssertionError`` with the
        health document after ``within`` seconds."""
        deadline = time.monotonic() + within
        while not set(names) <= set(self.http.get("/healthz").json()["classes"]["available"]):
            assert time.monotonic() < deadline, self.http.get("/healthz").text
            time.sleep(0.25)

    def wait_ready(self, timeout: float = 300.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                raise RuntimeError(
                    f"podbay {self.role} exited {self.process.returncode}:\n" + self.log_tail()
                )
            try:
                r = self.http.get("/healthz", timeout=2)
                if r.status_code == 200:
                    return
                if r.json().get("error"):
                    raise RuntimeError(f"podbay {self.role} could not start: {r.json()}")
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        raise TimeoutError(f"podbay {self.role} did not become ready:\n" + self.log_tail())

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text().splitlines()[-lines:])
        except OSError:
            return ""

    def terminate(self, timeout: float = 20.0) -> int:
        """SIGTERM and wait: the clean shutdown."""
        assert self.process is not None
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout)

    def kill9(self) -> None:
        assert self.process is not None
        self.process.kill()
        self.process.wait(10)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it does not end; nothing if not running."""
        if self.process is None or self.process.poll() is not None:
            return
        try:
            self.terminate()
        except subprocess.TimeoutExpired:
            self.kill9()

    @property
    def url(self) -> str:
        return self.base_url

    @property
    def name(self) -> str:
        """The directory it runs in (``node-1``, ``control-0`` in a cluster)."""
        return self.root.name

    def restart(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.terminate()
        self.spawn()
        self.wait_ready()

    def close(self) -> None:
        self.stop()
        self.http.close()
        if self.role != "control":  # the control plane holds no machines
            self.destroy_machines()

    def destroy_machines(self) -> None:
        """Every machine this server's data directory holds, gone."""
        from .fixtures import cleanup, sandbox_settings

        settings = sandbox_settings(self.data_dir)
        settings.runtime.run_dir = self.run_dir
        settings.runtime.image_dir = self.env["PODBAY_RUNTIME_IMAGE_DIR"]
        cleanup(settings)

    def __enter__(self) -> PlatformServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the CLI ---------------------------------------------------------------------
    def cli(
        self, *args: str, input: str | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        return run_cli([*args, "--data-dir", str(self.data_dir)], self.env, input, check)

    def create_deployment(
        self, name: str, spec: str | None = SANDBOX_SPEC, account: str | None = None
    ) -> str:
        """Register ``name`` through the CLI; returns its identity token."""
        args = ["deployment", "create", name]
        if spec is not None:
            args += ["--spec", "-"]
        if account:
            args += ["--account", account]
        out = self.cli(*args, input=spec)
        return out.stdout.strip().splitlines()[-1]

    # -- the API ---------------------------------------------------------------------
    def api(self, method: str, path: str, token: str | None, **kw: Any) -> httpx.Response:
        headers = dict(kw.pop("headers", {}) or {})
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        return self.http.request(method, path, headers=headers, **kw)

    def attach(self, token: str, name: str, **kw: Any) -> httpx.Response:
        return self.api("PUT", f"/api/v1/sandboxes/{name}", token, **kw)

    def data(self, handle: dict[str, Any], method: str, path: str, **kw: Any) -> httpx.Response:
        """A data-plane call with a handle's endpoint and headers."""
        headers = {**handle["headers"], **(kw.pop("headers", {}) or {})}
        return self.http.request(method, handle["endpoint"] + path, headers=headers, **kw)

    def exec(self, handle: dict[str, Any], *argv: str, **kw: Any) -> httpx.Response:
        return self.data(handle, "POST", "/v1/exec", json={"command": list(argv), **kw})

    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid


def e2b_key(server: PlatformServer, deployment: str) -> str:
    """A new deployment of ``server`` and the E2B key ``--e2b-key`` printed for it
    (its last line)."""
    out = server.cli(
        "deployment", "create", deployment, "--spec", "-", "--e2b-key", input=SANDBOX_SPEC
    )
    key = out.stdout.strip().splitlines()[-1]
    assert key.startswith("e2b_")
    assert len(key) == 44
    return key
