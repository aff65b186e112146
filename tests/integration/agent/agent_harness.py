"""The agent under test: a real process on a real unix socket, started the way
the runtime starts it (a staged copy, ``python -I -S``, a listening socket
passed as an inherited fd, an env file), and a client for it.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from podbay.runtime.staging import AGENT_ENV, agent_argv
from podbay.wire import paths, stream

#: A variable in the agent's own environment that commands must never see.
AGENT_SECRET = "PODBAY_TEST_AGENT_SECRET"
#: A variable from the env file that every command must see.
DECLARED = {"PODBAY_DECLARED": "from-env-file"}


class Agent:
    """One running agent: its process, socket, workspace and a client."""

    def __init__(
        self, proc: subprocess.Popen[bytes], sock_path: str, workspace: Path, wrapped: bool = False
    ) -> None:
        self.proc = proc
        self.wrapped = wrapped
        self.sock_path = sock_path
        self.workspace = workspace
        self.client = httpx.Client(
            transport=httpx.HTTPTransport(uds=sock_path), base_url="http://agent", timeout=30
        )

    @property
    def pid(self) -> int:
        """The agent's pid as the host sees it (the wrapper's child when wrapped)."""
        children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children")
        if self.wrapped:
            pids = children.read_text().split()
            if pids:
                return int(pids[0])
        return self.proc.pid

    def new_client(self) -> httpx.Client:
        return httpx.Client(
            transport=httpx.HTTPTransport(uds=self.sock_path), base_url="http://agent", timeout=30
        )

    def exec(self, command: list[str], **fields: Any) -> httpx.Response:
        return self.client.post("/v1/exec", json={"command": command, **fields})

    def spawn(self, command: list[str], **fields: Any) -> httpx.Response:
        return self.client.post("/v1/processes", json={"command": command, **fields})

    def wait_exited(self, process_id: str, timeout: float = 10) -> dict[str, Any]:
        """Poll the status (without reading output) until the process exited."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for status in self.client.get("/v1/processes").json()["processes"]:
                if status["process_id"] == process_id and status["state"] == "exited":
                    return dict(status)
            time.sleep(0.02)
        raise AssertionError(f"process {process_id} still running after {timeout}s")

    def forget_all(self) -> None:
        for status in self.client.get("/v1/processes").json()["processes"]:
            self.client.delete(f"/v1/processes/{status['process_id']}")

    def rss_kib(self, field: str = "VmRSS") -> int:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
        raise AssertionError(field)

    def stop(self) -> None:
        self.client.close()
        if self.proc.poll() is None:
            # As PID 1 the agent ignores SIGTERM by design; the runtime kills it.
            os.kill(self.pid, signal.SIGKILL if self.wrapped else signal.SIGTERM)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def gone(pid: int, within: float = 2.0) -> bool:
    """True once ``pid`` no longer exists (killed and reaped)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.01)
    return False


#: How a guarded agent is started, as the runtime starts it under gVisor (see
#: podbay.agent.guard), here as the init of a PID namespace of its own.
GUARDED = ("unshare", "--pid", "--fork", "--mount-proc", "--kill-child=SIGTERM")
GUARD_ARGS = ("--guard-uid", "65535")


def launcher_program(where: Path) -> Path:
    """The launcher program (podbay/agent/launcher.c) staged under ``where`` as
    the gvisor class stages it (with the statx shim, from podbay's build)."""
    from podbay.runtime.oci.runsc import stage_statx_shim

    return stage_statx_shim(where) / "launcher"


def start_agent(
    tmp: Path,
    staged: Path,
    wrapper: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
    args: tuple[str, ...] = (),
) -> Agent:
    """Start an agent in ``tmp``; ``wrapper`` prefixes its command line (``unshare``);
    ``env`` adds to its environment; ``args`` to its options (``GUARD_ARGS``)."""
    workspace = tmp / "workspace"
    workspace.mkdir(parents=True, exist_ok=True)
    env_file = tmp / "env.json"
    env_file.write_text(json.dumps(DECLARED))
    sock_path = str(tmp / "agent.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(sock_path)
    listener.listen(128)
    fd = listener.fileno()
    argv = agent_argv(
        [sys.executable],
        staged,
        "--fd",
        str(fd),
        "--workspace",
        str(workspace),
        "--env-file",
        str(env_file),
        *args,
    )
    full_env = {**os.environ, **AGENT_ENV, AGENT_SECRET: "must-not-leak", **(env or {})}
    proc = subprocess.Popen([*wrapper, *argv], pass_fds=(fd,), env=full_env, cwd=str(tmp))
    listener.close()
    agent = Agent(proc, sock_path, workspace, wrapped=bool(wrapper))
    assert agent.client.get("/v1/info").status_code == 200
    return agent


#: Every socket :func:`upgrade` opened, closed after each test (conftest's
#: ``close_upgraded``): tests that only read the answer's head leave theirs.
UPGRADED: list[socket.socket] = []


def upgrade(
    agent: Agent, method: str, target: str, token: str, body: bytes = b""
) -> tuple[socket.socket, bytes, bytes]:
    """Send an upgrade request; the socket, the answer's head and what followed it."""
    sock = socket.socket(socket.AF_UNIX)
    UPGRADED.append(sock)
    sock.settimeout(30)
    sock.connect(agent.sock_path)
    sock.sendall(
        f"{method} {target} HTTP/1.1\r\nhost: agent\r\nconnection: upgrade\r\n"
        f"upgrade: {token}\r\ncontent-length: {len(body)}\r\n\r\n".encode()
        + body
    )
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, data
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    return sock, head, rest


class Frames:
    """Stream frames read from an upgraded connection."""

    def __init__(self, sock: socket.socket, rest: bytes) -> None:
        self.sock, self.buf = sock, bytearray(rest)

    def next(self) -> tuple[bytes, bytes]:
        while True:
            if len(self.buf) >= stream.HEADER.size:
                kind, length = stream.parse_header(bytes(self.buf[: stream.HEADER.size]))
                end = stream.HEADER.size + length
                if len(self.buf) >= end:
                    payload = bytes(self.buf[stream.HEADER.size : end])
                    del self.buf[:end]
                    return kind, payload
            chunk = self.sock.recv(65536)
            assert chunk, "the agent closed the terminal stream"
            self.buf += chunk

    def exit_code(self) -> int:
        """Skip output until the EXIT frame; its code."""
        while True:
            kind, payload = self.next()
            if kind == stream.EXIT:
                return stream.parse_exit(payload)

    def output_until(self, needle: bytes) -> bytes:
        seen = b""
        while needle not in seen:
            kind, payload = self.next()
            assert kind == stream.DATA, (kind, payload, seen)
            seen += payload
        return seen


def open_pty(agent: Agent, **fields: object) -> tuple[socket.socket, bytes, Frames]:
    """Start a command on a terminal: the socket, the answer's head, its frames."""
    body = json.dumps(fields).encode()
    sock, head, rest = upgrade(agent, "POST", paths.PTY, paths.UPGRADE_PTY, body)
    return sock, head, Frames(sock, rest)
