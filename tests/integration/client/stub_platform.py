"""A stand-in platform over REAL agents, for client tests before `podbay serve` is usable.

Speaks the contract on a real TCP port (uvicorn): the control plane's
``/api/v1/sandboxes`` (attach with 202s on demand, get, list, stop,
delete) and a mini gateway at ``/sbx/{name}/...`` that checks the
handle's credential (401 when wrong, so re-attach is exercised) and
streams requests and answers to that sandbox's own real agent process
(``python -m podbay.agent --socket ... --workspace ...``). No isolation: it
tests the client and the wire, not the runtime.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from podbay.wire.limits import is_valid_sandbox_name

HOP = {"connection", "keep-alive", "transfer-encoding", "host", "content-length"}


def make_token(iss: str, sub: str = "dep-stub") -> str:
    def part(obj: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(obj).encode()).decode().rstrip("=")

    return f"{part({'alg': 'none', 'typ': 'JWT'})}.{part({'iss': iss, 'sub': sub})}.c3R1Yg"


def refuse(status: int, code: str, message: str) -> JSONResponse:
    return JSONResponse({"error": message, "code": code}, status_code=status)


class Sandbox:
    def __init__(self, name: str, root: Path) -> None:
        self.name = name
        self.dir = Path(tempfile.mkdtemp(prefix="sbx-", dir=root))
        self.workspace = self.dir / "workspace"
        self.workspace.mkdir()
        self.socket = str(self.dir / "agent.sock")
        self.agent: subprocess.Popen[bytes] | None = None
        self.credential = ""
        now = datetime.now(UTC)
        self.record: dict[str, Any] = {"name": name, "class": "default", "state": "running",
                                       "created_at": now.isoformat(),
                                       "last_active_at": now.isoformat()}
        self.http: httpx.AsyncClient | None = None

    def start(self) -> None:
        if self.agent is not None and self.agent.poll() is None:
            return
        with contextlib.suppress(OSError):
            os.unlink(self.socket)
        self.agent = subprocess.Popen(
            [sys.executable, "-m", "podbay.agent", "--socket", self.socket,
             "--workspace", str(self.workspace)], stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with socket.socket(socket.AF_UNIX) as probe:
                try:
                    probe.connect(self.socket)
                    break
                except OSError:
                    time.sleep(0.02)
        else:
            raise RuntimeError("agent did not start")
        self.http = httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(uds=self.socket),
                                      base_url="http://agent", timeout=None)

    def stop(self) -> None:
        if self.agent is not None and self.agent.poll() is None:
            self.agent.terminate()
            try:
                self.agent.wait(5)
            except subprocess.TimeoutExpired:
                self.agent.kill()
                self.agent.wait()
        self.agent = None


class StubPlatform:
    """``with StubPlatform() as p: p.url, p.token``; knobs: ``preparing``, ``ttl``."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="podbay-stub-"))
        self.sandboxes: dict[str, Sandbox] = {}
        self.preparing = 0
        self.ttl = timedelta(minutes=15)
        self.attaches = 0
        self.lock = threading.Lock()
        self.url = ""
        self.token = ""
        app = Starlette(routes=[
            Route("/api/v1/sandboxes", self.list, methods=["GET"]),
            Route("/api/v1/sandboxes/{name}", self.sandbox, methods=["PUT", "GET", "DELETE"]),
            Route("/api/v1/sandboxes/{name}/stop", self.stop, methods=["POST"]),
            Route("/sbx/{name}/{rest:path}", self.relay,
                  methods=["GET", "POST", "PUT", "DELETE"]),
        ])
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self._sock = sock
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        self.token = make_token(self.url)
        config = uvicorn.Config(app, log_level="warning", lifespan="off", http="httptools")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]},
                                        daemon=True)

    def __enter__(self) -> StubPlatform:
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started and time.monotonic() < deadline:
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: Any) -> None:
        self._server.should_exit = True
        self._thread.join(10)
        for sandbox in self.sandboxes.values():
            sandbox.stop()
        shutil.rmtree(self.root, ignore_errors=True)

    def workspace(self, name: str) -> Path:
        return self.sandboxes[name].workspace

    def expire_credentials(self, name: str) -> None:
        self.sandboxes[name].credential = "expired-" + secrets.token_hex(4)

    # -- control plane --------------------------------------------------------------

    def _authorized(self, request: Request) -> bool:
        return request.headers.get("authorization") == f"Bearer {self.token}"

    async def list(self, request: Request) -> Response:
        if not self._authorized(request):
            return refuse(401, "IDENTITY_TOKEN_INVALID", "bad identity token")
        return JSONResponse({"sandboxes": [s.record for s in self.sandboxes.values()]})

    async def sandbox(self, request: Request) -> Response:
        if not self._authorized(request):
            return refuse(401, "IDENTITY_TOKEN_INVALID", "bad identity token")
        name = request.path_params["name"]
        if not is_valid_sandbox_name(name):
            return refuse(400, "SANDBOX_NAME_INVALID", f"invalid sandbox name {name!r}")
        if request.method == "PUT":
            body = json.loads(await request.body() or b"{}")
            if body.get("class", "default") != "default":
                return refuse(409, "SANDBOX_CLASS_UNKNOWN", "only class 'default' exists")
            if self.preparing > 0:
                self.preparing -= 1
                return JSONResponse({"name": name, "state": "creating"}, status_code=202,
                                    headers={"Retry-After": "0.2"})
            return await asyncio.to_thread(self._attach, name)
        sandbox = self.sandboxes.get(name)
        if sandbox is None:
            return refuse(404, "SANDBOX_NOT_FOUND", f"no sandbox named {name}")
        if request.method == "GET":
            return JSONResponse(sandbox.record)
        await asyncio.to_thread(sandbox.stop)
        shutil.rmtree(sandbox.dir, ignore_errors=True)
        del self.sandboxes[name]
        return Response(status_code=204)

    def _attach(self, name: str) -> Response:
        with self.lock:
            self.attaches += 1
            sandbox = self.sandboxes.get(name)
            start = "reused"
            if sandbox is None:
                sandbox = self.sandboxes[name] = Sandbox(name, self.root)
                start = "created"
            elif sandbox.agent is None:
                start = "resumed"
            sandbox.start()
            sandbox.record["state"] = "running"
            sandbox.record["last_active_at"] = datetime.now(UTC).isoformat()
            sandbox.credential = secrets.token_urlsafe(16)
            return JSONResponse({
                **sandbox.record, "endpoint": f"{self.url}/sbx/{name}",
                "headers": {"X-Podbay-Credential": sandbox.credential},
                "expires_at": (datetime.now(UTC) + self.ttl).isoformat(), "start": start})

    async def stop(self, request: Request) -> Response:
        if not self._authorized(request):
            return refuse(401, "IDENTITY_TOKEN_INVALID", "bad identity token")
        sandbox = self.sandboxes.get(request.path_params["name"])
        if sandbox is None:
            return refuse(404, "SANDBOX_NOT_FOUND", "no such sandbox")
        sandbox.credential = ""
        sandbox.record["state"] = "suspended"
        return Response(status_code=204)

    # -- gateway ------------------------------------------------------------------------

    async def relay(self, request: Request) -> Response:
        sandbox = self.sandboxes.get(request.path_params["name"])
        given = request.headers.get("x-podbay-credential")
        if sandbox is None or not given or not secrets.compare_digest(given, sandbox.credential):
            return refuse(401, "CREDENTIAL_INVALID", "credential missing, expired or forged")
        assert sandbox.http is not None
        headers = {k: v for k, v in request.headers.items()
                   if k.lower() not in HOP and k.lower() != "x-podbay-credential"}
        length = request.headers.get("content-length")
        if length:
            headers["content-length"] = length
        upstream = sandbox.http.build_request(
            request.method, "/" + request.path_params["rest"],
            params=request.query_params.multi_items(), headers=headers,
            content=request.stream() if request.method in ("POST", "PUT") else None)
        try:
            answer = await sandbox.http.send(upstream, stream=True)
        except httpx.TransportError as exc:
            return refuse(502, "AGENT_UNREACHABLE", str(exc))
        out_headers = {k: v for k, v in answer.headers.items() if k.lower() not in HOP}
        if "content-length" in answer.headers:
            out_headers["content-length"] = answer.headers["content-length"]
        return StreamingResponse(answer.aiter_raw(), status_code=answer.status_code,
                                 headers=out_headers, background=_Close(answer))


class _Close:
    def __init__(self, response: httpx.Response) -> None:
        self.response = response

    async def __call__(self) -> None:
        await self.response.aclose()
