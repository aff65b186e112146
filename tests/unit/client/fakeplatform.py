"""A fake control plane + data plane behind ``httpx.MockTransport``.

It speaks the wire contract closely enough to exercise every client method
without a network: ``/v1/exec`` and ``/v1/processes`` really run the argv
(with ``/workspace`` mapped to a temporary directory), native files are real
files, and each rule the client must honour can be provoked (202s, expired
credentials, transport failures, corrupted digests).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import signal as signals
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import httpx

from podbay.wire.limits import EXEC_OUTPUT_CAP

SERVER = "http://control.test"
ENDPOINT = "http://node.test/sbx"


def make_token(iss: str = SERVER, sub: str = "dep-1") -> str:
    def part(obj: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(obj).encode()).decode().rstrip("=")

    return f"{part({'alg': 'none'})}.{part({'iss': iss, 'sub': sub})}.c2ln"


def refusal(status: int, code: str, message: str = "refused") -> httpx.Response:
    return httpx.Response(status, json={"error": message, "code": code})


def file_info(path: str, local: Path) -> dict[str, Any]:
    """A ``FileInfo`` (wire/data.py) of the file at ``path`` in the sandbox."""
    stat = local.stat()
    return {
        "name": path.rsplit("/", 1)[-1],
        "path": path,
        "size": stat.st_size,
        "mode": stat.st_mode & 0o7777,
        "type": "directory" if local.is_dir() else "file",
        "mtime": datetime.fromtimestamp(stat.st_mtime, UTC).isoformat(),
    }


@dataclass
class Proc:
    popen: subprocess.Popen[bytes]
    command: list[str]
    out: Path
    err: Path
    started_at: datetime


@dataclass
class Fake:
    """State plus the request handler; every knob a test turns is an attribute."""

    workspace: Path
    token: str = field(default_factory=make_token)
    features: list[str] = field(default_factory=lambda: ["files"])
    preparing: int = 0  # answer 202 this many times before a 200
    retry_after: str | None = "0.01"
    preparing_extra: dict[str, Any] = field(default_factory=dict)  # more of the 202's body
    ttl: timedelta = timedelta(minutes=15)
    reject_credentials: int = 0  # answer 401 to this many data-plane calls
    fail_after_send: set[str] = field(default_factory=set)  # paths that "lose" the answer
    corrupt_reads: bool = False
    not_enabled: bool = False
    refuse_control: int = 0  # refuse this many control-plane connections (server away)
    #: Answer this many attaches 503 SANDBOXES_UNAVAILABLE with this Retry-After
    #: (None: without one), as a server checking the class asked for does.
    checking: int = 0
    checking_retry_after: str | None = "2"
    requests: list[httpx.Request] = field(default_factory=list)
    #: Every answer given, with its request (test_fakeplatform_wire.py checks
    #: their shapes against the wire contract).
    exchanges: list[tuple[httpx.Request, httpx.Response]] = field(default_factory=list)
    attaches: int = 0
    sandboxes: dict[str, dict[str, Any]] = field(default_factory=dict)
    credentials: dict[str, str] = field(default_factory=dict)
    procs: dict[str, Proc] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    # -- plumbing ---------------------------------------------------------------

    def __call__(self, request: httpx.Request) -> httpx.Response:
        with self.lock:
            self.requests.append(request)
        path = request.url.path
        if request.url.host == "control.test":
            if self.refuse_control > 0:
                self.refuse_control -= 1
                raise httpx.ConnectError("connection refused", request=request)
            response = self.control(request, path)
        else:
            response = self.data(request, path)
        with self.lock:
            self.exchanges.append((request, response))
        return response

    def count(self, method: str, suffix: str) -> int:
        return sum(1 for r in self.requests if r.method == method and r.url.path.endswith(suffix))

    def local(self, path: str, cwd: str | None = None) -> Path:
        if path.startswith("/workspace"):
            return self.workspace / path[len("/workspace") :].lstrip("/")
        if path.startswith("/"):
            return Path(path)
        return self.local(cwd or "/workspace") / path

    def close(self) -> None:
        for proc in self.procs.values():
            if proc.popen.poll() is None:
                proc.popen.kill()
            proc.popen.wait()

    # -- control plane ----------------------------------------------------------

    def control(self, request: httpx.Request, path: str) -> httpx.Response:
        if request.headers.get("Authorization") != f"Bearer {self.token}":
            return refusal(401, "IDENTITY_TOKEN_INVALID")
        parts = path.split("/")[4:]  # /api/v1/sandboxes/...
        if request.method == "GET" and not parts:
            return httpx.Response(200, json={"sandboxes": list(self.sandboxes.values())})
        name = unquote(parts[0])
        if request.method == "PUT":
            if self.not_enabled:
                return refusal(409, "SANDBOX_NOT_DECLARED", "no sandbox section")
            body = json.loads(request.content or b"{}")
            if body.get("class", "default") != "default":
                return refusal(409, "SANDBOX_CLASS_UNKNOWN")
            if self.checking > 0:
                self.checking -= 1
                headers = (
                    {"Retry-After": self.checking_retry_after} if self.checking_retry_after else {}
                )
                refused = refusal(503, "SANDBOXES_UNAVAILABLE", "class still being checked")
                return httpx.Response(503, json=refused.json(), headers=headers)
            if self.preparing > 0:
                self.preparing -= 1
                headers = {"Retry-After": self.retry_after} if self.retry_after else {}
                body = {"name": name, "state": "creating", **self.preparing_extra}
                return httpx.Response(202, json=body, headers=headers)
            self.attaches += 1
            now = datetime.now(UTC)
            record = self.sandboxes.setdefault(
                name,
                {
                    "name": name,
                    "class": "default",
                    "state": "running",
                    "created_at": now.isoformat(),
                    "last_active_at": now.isoformat(),
                },
            )
            record["state"] = "running"
            credential = f"cred-{name}-{self.attaches}"
            self.credentials[name] = credential
            handle = {
                **record,
                "endpoint": f"{ENDPOINT}/{name}",
                "headers": {"X-Podbay-Credential": credential},
                "expires_at": (now + self.ttl).isoformat(),
                "start": "created",
                "future_field": "ignored by old clients",
            }
            return httpx.Response(200, json=handle)
        record = self.sandboxes.get(name)
        if record is None:
            return refusal(404, "SANDBOX_NOT_FOUND", f"no sandbox named {name}")
        if request.method == "GET":
            return httpx.Response(200, json=record)
        if request.method == "POST" and parts[1:] == ["stop"]:
            record["state"] = "suspended"
            self.credentials.pop(name, None)
            return httpx.Response(204)
        if request.method == "DELETE":
            del self.sandboxes[name]
            self.credentials.pop(name, None)
            return httpx.Response(204)
        return refusal(405, "METHOD_NOT_ALLOWED")

    # -- data plane --------------------------------------------------------------

    def data(self, request: httpx.Request, path: str) -> httpx.Response:
        _, name, *rest = path.lstrip("/").split("/")
        route = "/" + "/".join(rest)
        if self.reject_credentials > 0:
            self.reject_credentials -= 1
            return refusal(401, "CREDENTIAL_INVALID")
        if request.headers.get("X-Podbay-Credential") != self.credentials.get(name):
            return refusal(401, "CREDENTIAL_INVALID")
        if route in self.fail_after_send:
            self.dispatch(request, route)  # it ran...
            raise httpx.ReadError("connection reset by peer", request=request)  # ...no answer
        return self.dispatch(request, route)

    def dispatch(self, request: httpx.Request, route: str) -> httpx.Response:
        method = request.method
        if route == "/v1/info":
            if self.features is None:
                return refusal(404, "ROUTE_NOT_FOUND")
            return httpx.Response(200, json={"version": "fake", "features": self.features})
        if route == "/v1/exec" and method == "POST":
            return self.exec(json.loads(request.content))
        if route == "/v1/processes":
            if method == "POST":
                return self.spawn(json.loads(request.content))
            return httpx.Response(
                200, json={"processes": [self.status(p, i) for i, p in self.procs.items()]}
            )
        if route.startswith("/v1/processes/"):
            pid, _, action = route[len("/v1/processes/") :].partition("/")
            proc = self.procs.get(pid)
            if proc is None:
                return refusal(404, "PROCESS_NOT_FOUND")
            if action == "signal":
                sig = json.loads(request.content)["signal"]
                if proc.popen.poll() is None:
                    os.killpg(proc.popen.pid, getattr(signals, f"SIG{sig}"))
                return httpx.Response(204)
            if method == "DELETE":
                if proc.popen.poll() is None:
                    os.killpg(proc.popen.pid, signals.SIGKILL)
                proc.popen.wait()
                del self.procs[pid]
                return httpx.Response(204)
            return self.poll(pid, proc, request.url.params)
        if route.startswith("/v1/files"):
            return self.files(request, route)
        return refusal(404, "ROUTE_NOT_FOUND")

    def exec(self, body: dict[str, Any]) -> httpx.Response:
        timeout = body.get("timeout_ms", 60_000) / 1000
        cwd = self.local(body.get("cwd") or "/workspace")
        start = time.monotonic()
        try:
            proc = subprocess.Popen(
                body["command"],
                cwd=cwd,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env={**os.environ, **(body.get("env") or {})},
            )
        except OSError as exc:
            return refusal(400, "COMMAND_START_FAILED", str(exc))
        timed_out = False
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            timed_out = True
        code = proc.returncode if proc.returncode >= 0 else 128 - proc.returncode
        truncated = len(out) > EXEC_OUTPUT_CAP or len(err) > EXEC_OUTPUT_CAP
        return httpx.Response(
            200,
            json={
                "exit_code": code,
                "stdout": out[:EXEC_OUTPUT_CAP].decode(errors="replace"),
                "stderr": err[:EXEC_OUTPUT_CAP].decode(errors="replace"),
                "duration_ms": int((time.monotonic() - start) * 1000),
                "timed_out": timed_out,
                "truncated": truncated,
            },
        )

    def spawn(self, body: dict[str, Any]) -> httpx.Response:
        pid = f"p{len(self.procs) + 1}-{time.monotonic_ns()}"
        out = Path(tempfile.mktemp(prefix="fake-out-"))
        err = Path(tempfile.mktemp(prefix="fake-err-"))
        with open(out, "wb") as o, open(err, "wb") as e:
            popen = subprocess.Popen(
                body["command"],
                stdout=o,
                stderr=e,
                cwd=self.local(body.get("cwd") or "/workspace"),
                start_new_session=True,
            )
        proc = Proc(popen, body["command"], out, err, datetime.now(UTC))
        self.procs[pid] = proc
        return httpx.Response(200, json=self.status(proc, pid))

    def status(self, proc: Proc, pid: str) -> dict[str, Any]:
        code = proc.popen.poll()
        status: dict[str, Any] = {
            "process_id": pid,
            "command": proc.command,
            "state": "running" if code is None else "exited",
            "started_at": proc.started_at.isoformat(),
        }
        if code is not None:
            status["exit_code"] = code if code >= 0 else 128 - code
            status["exited_at"] = datetime.now(UTC).isoformat()
        return status

    def poll(self, pid: str, proc: Proc, params: httpx.QueryParams) -> httpx.Response:
        status = self.status(proc, pid)  # before reading: exited => all output is in
        out = proc.out.read_bytes()[int(params.get("stdout_from", 0)) :]
        err = proc.err.read_bytes()[int(params.get("stderr_from", 0)) :]
        return httpx.Response(
            200,
            json={
                **status,
                "stdout": out.decode(errors="replace"),
                "stderr": err.decode(errors="replace"),
                "stdout_next": int(params.get("stdout_from", 0)) + len(out),
                "stderr_next": int(params.get("stderr_from", 0)) + len(err),
                "stdout_dropped": 0,
                "stderr_dropped": 0,
            },
        )

    def files(self, request: httpx.Request, route: str) -> httpx.Response:
        target = self.local(request.url.params["path"])
        if route == "/v1/files/list":
            if not target.is_dir():
                return refusal(404, "PATH_NOT_FOUND")
            where = request.url.params["path"].rstrip("/")
            entries = [file_info(f"{where}/{p.name}", p) for p in sorted(target.iterdir())]
            return httpx.Response(200, json={"path": where, "entries": entries})
        if request.method == "GET":
            if not target.is_file():
                return refusal(404, "PATH_NOT_FOUND", f"no file {target}")
            data = target.read_bytes()
            digest = hashlib.sha256(data).hexdigest()
            if self.corrupt_reads and data:
                data = bytes([data[0] ^ 1]) + data[1:]
            return httpx.Response(200, content=data, headers={"X-Podbay-Sha256": digest})
        if request.method == "PUT":
            data = request.content
            if hashlib.sha256(data).hexdigest() != request.headers.get("X-Podbay-Sha256"):
                return refusal(422, "DIGEST_MISMATCH")
            target.write_bytes(data)
            # As the agent answers: what was written, at its path in the sandbox.
            return httpx.Response(200, json=file_info(request.url.params["path"], target))
        return refusal(405, "METHOD_NOT_ALLOWED")
