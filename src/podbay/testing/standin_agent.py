"""A minimal stand-in for the sandbox agent, for runtime tests before the real one.

Stdlib only. Serves ``GET /v1/info`` and ``POST /v1/exec`` (the contract's
shape, nothing more) on the listening socket inherited as ``--fd N``. The
runtime stages it as ``podbay/agent/__main__.py`` only when the real agent is
missing from the installed package.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler
from socketserver import ThreadingMixIn, UnixStreamServer

BASE_ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "HOME": "/root", "LANG": "C.UTF-8"}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Server

    def log_message(self, format: str, *args: object) -> None:
        pass

    def _answer(self, status: int, body: dict[str, object]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path == "/v1/info":
            self._answer(200, {"agent": "standin", "features": []})
        else:
            self._answer(404, {"error": "no such path", "code": "NOT_FOUND"})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
        if self.path != "/v1/exec":
            self._answer(404, {"error": "no such path", "code": "NOT_FOUND"})
            return
        env = {**BASE_ENV, **self.server.sandbox_env, **(body.get("env") or {})}
        started = time.monotonic()
        timeout = (body.get("timeout_ms") or 60_000) / 1000
        try:
            proc = subprocess.Popen(body["command"], cwd=body.get("cwd") or "/workspace",
                                    env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, start_new_session=True)
        except OSError as e:
            self._answer(400, {"error": str(e), "code": "COMMAND_START_FAILED"})
            return
        timed_out = False
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
        code = proc.returncode if proc.returncode >= 0 else 128 - proc.returncode
        self._answer(200, {"exit_code": code, "stdout": out.decode(errors="replace"),
                           "stderr": err.decode(errors="replace"),
                           "duration_ms": int((time.monotonic() - started) * 1000),
                           "timed_out": timed_out, "truncated": False})


class Server(ThreadingMixIn, UnixStreamServer):
    daemon_threads = True
    sandbox_env: dict[str, str] = {}

    def __init__(self, fd: int) -> None:
        self.socket = socket.socket(fileno=fd)
        self.server_address = self.socket.getsockname()
        self.RequestHandlerClass = Handler
        self._BaseServer__is_shut_down = threading.Event()  # type: ignore[attr-defined]
        self._BaseServer__shutdown_request = False  # type: ignore[attr-defined]


def _reap_orphans() -> None:
    while True:
        time.sleep(1)
        try:
            while os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                info = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
                if info is None:
                    break
                # Only reap children nobody else waits for (subprocess reaps its own).
                time.sleep(0.05)
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(info.si_pid, os.WNOHANG)
        except ChildProcessError:
            pass


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    fd = int(args[args.index("--fd") + 1])
    server = Server(fd)
    if "--env-file" in args:
        with open(args[args.index("--env-file") + 1]) as f:
            server.sandbox_env = json.load(f)
    threading.Thread(target=_reap_orphans, daemon=True).start()
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
