"""The code interpreter's API: what ``e2b-code-interpreter`` asks of port 49999
(``E2b-Sandbox-Port: 49999``), answered by podbay's own interpreter kernel
(``podbay/client/_kernel.py``) running inside the sandbox.

- ``POST /execute`` ``{"code", "context_id", "language", "env_vars"}``: a
  stream of JSON lines (``stdout``, ``stderr``, ``result``, ``error``,
  ``number_of_executions``, ``end_of_execution``).
- ``POST /contexts`` ``{"cwd", "language"}``, ``GET /contexts``,
  ``POST /contexts/{id}/restart``, ``DELETE /contexts/{id}``.

A context is one kernel process. The default python context is the kernel
that podbay's own ``run_code`` uses (port 49999, the same token file), so
both APIs share its variables; every created context gets its own kernel on
its own loopback port, started in its ``cwd``. The contexts live in a file
inside the sandbox (``CONTEXTS_FILE``), so any server replica, and a server
restarted, finds them. Languages: python, and bash (a python kernel driving
one shell per context, ``_bash_cell``). A cell's stdout and stderr stream as
the kernel writes them (its ``"stream": true`` answer), in whole lines.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import re
import secrets
import time
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from podbay.client import _interpreter
from podbay.control.services.sandboxes import Attached
from podbay.errors import ApiError
from podbay.wire.paths import CREDENTIAL_HEADER, DIGEST_HEADER, EXEC, FILES, PORTS, PROCESSES

from . import envd, relay
from .error_responses import E2BError
from .service import E2BService

#: The port ``e2b-code-interpreter`` sends to (``E2b-Sandbox-Port``).
PORT = _interpreter.KERNEL_PORT
PORT_HEADER = "e2b-sandbox-port"
#: The SDK sends the access token on ``/execute`` only; the context calls carry
#: this one, which the control API hands out as ``trafficAccessToken``.
TRAFFIC_TOKEN_HEADER = "e2b-traffic-access-token"
CONTEXTS_FILE = f"{_interpreter.KERNEL_DIR}/e2b-contexts.json"
DEFAULT_ID = "python"
#: Each language's default context (what ``run_code(language=...)`` runs in):
#: python's is the kernel podbay's own ``run_code`` uses.
DEFAULTS: dict[str, dict[str, Any]] = {
    "python": {"id": DEFAULT_ID, "language": "python", "cwd": "/workspace", "port": PORT},
    "bash": {"id": "bash", "language": "bash", "cwd": "/workspace", "port": PORT - 1},
}
#: A bash cell is this driver's source and a call: see its docstring.
BASH_CELL = (Path(__file__).with_name("_bash_cell.py")).read_text()
#: Created contexts' kernels listen on loopback ports from here up.
FIRST_CONTEXT_PORT = 50000
MAX_CONTEXTS = 64
CONTEXT_ID = re.compile(r"[0-9a-f]{32}")
MAX_CODE = 8 * 1024 * 1024
LANGUAGES = ("python", "bash")
#: The kernel's MIME types → the fields of E2B's ``Result``.
_FIELDS = {
    "text/plain": "text",
    "text/html": "html",
    "text/markdown": "markdown",
    "image/svg+xml": "svg",
    "image/png": "png",
    "image/jpeg": "jpeg",
    "application/pdf": "pdf",
    "text/latex": "latex",
    "application/json": "json",
    "application/javascript": "javascript",
}


class Plane:
    """One sandbox's data plane, as the interpreter needs it."""

    def __init__(self, http: httpx.AsyncClient, attached: Attached, sandbox_id: str) -> None:
        self.http = http
        self.sandbox_id = sandbox_id
        self.attached = attached
        self.base = attached.endpoint.rstrip("/")
        self.headers = {CREDENTIAL_HEADER: attached.credential}

    async def exec(self, argv: list[str]) -> int:
        answer = await self.http.post(
            self.base + EXEC, json={"command": argv}, headers=self.headers
        )
        if answer.status_code != 200:
            raise _refused(answer, f"{argv[0]} in the sandbox")
        code: int = answer.json()["exit_code"]
        return code

    async def read(self, path: str) -> bytes | None:
        answer = await self.http.get(self.base + FILES, params={"path": path}, headers=self.headers)
        return answer.content if answer.status_code == 200 else None

    async def write(self, path: str, data: bytes) -> None:
        answer = await self.http.put(
            self.base + FILES,
            params={"path": path},
            content=data,
            headers={**self.headers, DIGEST_HEADER: hashlib.sha256(data).hexdigest()},
        )
        if answer.status_code != 200:
            raise _unavailable(f"writing {path} in the sandbox failed: {answer.text[:500]}")

    async def spawn(self, argv: list[str], cwd: str | None, env: dict[str, str]) -> None:
        body: dict[str, Any] = {"command": argv, "env": env}
        if cwd:
            body["cwd"] = cwd
        answer = await self.http.post(self.base + PROCESSES, json=body, headers=self.headers)
        if answer.status_code not in (200, 201):
            raise _refused(answer, "starting the interpreter")

    def port_url(self, port: int, path: str) -> str:
        return f"{self.base}{PORTS}/{port}/{path.lstrip('/')}"


def _unavailable(message: str) -> E2BError:
    return E2BError(503, "INTERPRETER_UNAVAILABLE", message)


def _refused(answer: httpx.Response, what: str) -> E2BError:
    try:
        body = answer.json()
        message, code = str(body.get("error")), str(body.get("code"))
    except (ValueError, AttributeError):
        message, code = answer.text[:500], "INTERPRETER_UNAVAILABLE"
    status = answer.status_code if 400 <= answer.status_code < 500 else 503
    return E2BError(status, code, f"{what}: {message}")


class Kernel:
    """One context's kernel: found by its token file, started when none answers.

    Its token is remembered in ``tokens`` (shared by the requests this process
    serves), so a cell is one request to the kernel; a stale one (the kernel
    restarted elsewhere, or gone) is refused before anything runs, and then
    the token file is read again."""

    def __init__(
        self, plane: Plane, context: dict[str, Any], env: dict[str, str], tokens: dict[str, str]
    ) -> None:
        self.plane = plane
        self.context = context
        self.env = env
        self.tokens = tokens
        self.key = f"{plane.sandbox_id} {context['id']}"
        #: A fresh data plane, when the one in hand was refused (see ``_streamed``).
        self.refresh: Callable[[], Awaitable[Plane]] | None = None
        self.port = int(context["port"])
        self.token_file = (
            _interpreter.TOKEN_FILE
            if context["id"] == DEFAULT_ID
            else f"{_interpreter.KERNEL_DIR}/token-{context['id']}"
        )

    async def health(self) -> tuple[str, dict[str, Any]] | None:
        raw = await self.plane.read(self.token_file)
        token = raw.decode(errors="replace").strip() if raw else ""
        if not token:
            return None
        try:
            answer = await self.plane.http.get(
                self.plane.port_url(self.port, "/health"),
                headers={**self.plane.headers, _interpreter.TOKEN_HEADER: token},
            )
        except httpx.TransportError:
            return None
        health = _json_object(answer.content) if answer.status_code == 200 else None
        if health is None or not isinstance(health.get("pid"), int):
            return None
        return token, health

    async def token(self, *, fresh: bool = False) -> str:
        cached = None if fresh else self.tokens.get(self.key)
        if cached is not None:
            return cached
        self.tokens.pop(self.key, None)
        token = await self._find_or_start()
        self.tokens[self.key] = token
        return token

    async def _find_or_start(self) -> str:
        found = await self.health()
        if found is not None:
            return found[0]
        source = _interpreter.kernel_source()
        path = _interpreter.kernel_path(source)
        if await self.plane.exec(["mkdir", "-p", "-m", "700", _interpreter.KERNEL_DIR]):
            raise _unavailable(f"could not make {_interpreter.KERNEL_DIR} in the sandbox")
        await self.plane.write(path, source)
        argv = ["python3", "-u", path, str(self.port), self.token_file]
        cwd = None if self.context["id"] in DEFAULTS else self.context["cwd"]
        await self.plane.spawn(argv, cwd, self.env)
        deadline = time.monotonic() + _interpreter.START_TIMEOUT_SECONDS
        while time.monotonic() < deadline:
            found = await self.health()
            if found is not None:
                return found[0]
            await asyncio.sleep(0.02)
        raise _unavailable(
            f"the interpreter did not start in {_interpreter.START_TIMEOUT_SECONDS:g} s"
        )

    async def kill(self) -> None:
        self.tokens.pop(self.key, None)
        found = await self.health()
        if found is not None:
            await self.plane.exec(["kill", "-KILL", str(found[1]["pid"])])
            await self.plane.exec(["rm", "-f", self.token_file])

    def run(
        self, token: str, body: dict[str, Any]
    ) -> contextlib.AbstractAsyncContextManager[httpx.Response]:
        return self.plane.http.stream(
            "POST",
            self.plane.port_url(self.port, "/run"),
            json={**body, "stream": True},
            headers={**self.plane.headers, _interpreter.TOKEN_HEADER: token},
            timeout=None,
        )

    async def interrupt(self) -> None:
        token = self.tokens.get(self.key)
        if token is not None:
            await self.plane.http.post(
                self.plane.port_url(self.port, "/interrupt"),
                json={},
                headers={**self.plane.headers, _interpreter.TOKEN_HEADER: token},
            )


# -- the sandbox and its contexts ------------------------------------------------------
class Registry:
    """The contexts of the sandboxes this process serves; the list itself lives in
    the sandbox, a lock per sandbox keeps this process's changes in order."""

    def __init__(self, service: E2BService) -> None:
        self.service = service
        self.locks: defaultdict[str, asyncio.Lock] = defaultdict(asyncio.Lock)
        #: Kernel tokens by sandbox and context (see :class:`Kernel`).
        self.tokens: dict[str, str] = {}
        #: The data plane last attached to, by sandbox (see :meth:`reach`).
        self.attached: dict[str, Attached] = {}

    def kernel(self, plane: Plane, context: dict[str, Any], env: dict[str, str]) -> Kernel:
        return Kernel(plane, context, env, self.tokens)

    async def reach(
        self, request: Request, *, cached: bool = False
    ) -> tuple[str, Plane, dict[str, str]]:
        """The caller's sandbox (credentials checked on every call) and its data
        plane: with ``cached``, the one this process attached to last, while its
        credential has a minute left (cells skip the attach, as podbay's own
        SDK does; a refused one is replaced, see ``_streamed``)."""
        sandbox_id = request.headers.get(relay.SANDBOX_ID_HEADER, "")
        deployment, row = await self.service.authorize(
            sandbox_id,
            request.headers.get(relay.ACCESS_TOKEN_HEADER)
            or request.headers.get(TRAFFIC_TOKEN_HEADER),
            request.headers.get("x-api-key"),
        )
        attached = self.attached.get(sandbox_id) if cached else None
        if attached is None or attached.expires_at < datetime.now(UTC) + timedelta(minutes=1):
            attached = await self.service.reach(deployment, sandbox_id, row)
            self.attached[sandbox_id] = attached
        return sandbox_id, Plane(self.service.http, attached, sandbox_id), row.env_vars

    @staticmethod
    def default(language: str = "python") -> dict[str, Any]:
        return dict(DEFAULTS[language])

    async def contexts(self, plane: Plane) -> dict[str, dict[str, Any]]:
        raw = await plane.read(CONTEXTS_FILE)
        try:
            stored = json.loads(raw) if raw else {}
        except ValueError:
            stored = {}
        found = {c["id"]: dict(c) for c in DEFAULTS.values()}
        if isinstance(stored, dict):
            # Written by this module, but inside the sandbox: only well-formed entries count.
            found.update({k: v for k, v in stored.items() if _well_formed(k, v)})
        return found

    async def save(self, plane: Plane, contexts: dict[str, dict[str, Any]]) -> None:
        created = {
            k: v for k, v in contexts.items() if k not in {c["id"] for c in DEFAULTS.values()}
        }
        await plane.write(CONTEXTS_FILE, json.dumps(created).encode())

    async def context(self, plane: Plane, context_id: str) -> dict[str, Any]:
        found = (await self.contexts(plane)).get(context_id)
        if found is None:
            raise E2BError(404, "CONTEXT_NOT_FOUND", f"context {context_id!r} was not found")
        return found


def _registry(request: Request) -> Registry:
    registry: Registry = request.app.state.registry
    return registry


async def _json_body(request: Request) -> dict[str, Any]:
    raw = await request.body()
    if len(raw) > MAX_CODE:
        raise E2BError(413, "REQUEST_TOO_LARGE", f"a request is at most {MAX_CODE} bytes")
    try:
        body = json.loads(raw) if raw.strip() else {}
    except ValueError:
        raise E2BError(400, "REQUEST_INVALID", "the body is not JSON") from None
    if not isinstance(body, dict):
        raise E2BError(400, "REQUEST_INVALID", "the body must be a JSON object")
    return body


def _language(value: object) -> str:
    if value is None:
        return "python"
    if not isinstance(value, str) or value.lower() not in LANGUAGES:
        raise E2BError(
            400,
            "LANGUAGE_UNSUPPORTED",
            f"language {value!r} is not supported by podbay yet: {', '.join(LANGUAGES)} only",
        )
    return value.lower()


def _json_object(raw: bytes) -> dict[str, Any] | None:
    """A JSON object from the sandbox (hostile), or None."""
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _well_formed(context_id: str, context: object) -> bool:
    return (
        isinstance(context, dict)
        and CONTEXT_ID.fullmatch(context_id) is not None
        and context.get("id") == context_id
        and context.get("language") in LANGUAGES
        and isinstance(context.get("cwd"), str)
        and isinstance(context.get("port"), int)
        and FIRST_CONTEXT_PORT <= context["port"] < 65536
    )


def _public(context: dict[str, Any]) -> dict[str, Any]:
    return {"id": context["id"], "language": context["language"], "cwd": context["cwd"]}


# -- /contexts ---------------------------------------------------------------------------
async def create_context(request: Request) -> Response:
    body = await _json_body(request)
    language = _language(body.get("language"))
    cwd = body.get("cwd")
    if cwd is not None and (not isinstance(cwd, str) or not cwd.startswith("/") or "\x00" in cwd):
        raise E2BError(400, "REQUEST_INVALID", "cwd must be an absolute path")
    registry = _registry(request)
    sandbox_id, plane, env = await registry.reach(request)
    if cwd is None:
        # E2B's default is the user's home; podbay's image may not have one.
        cwd = "/home/user" if await plane.exec(["test", "-d", "/home/user"]) == 0 else "/workspace"
    async with registry.locks[sandbox_id]:
        contexts = await registry.contexts(plane)
        if len(contexts) > MAX_CONTEXTS:
            raise E2BError(429, "CONTEXT_LIMIT", f"at most {MAX_CONTEXTS} contexts per sandbox")
        used = {c["port"] for c in contexts.values()}
        port = next(p for p in range(FIRST_CONTEXT_PORT, 65536) if p not in used)
        context_id = secrets.token_hex(16)
        context = {"id": context_id, "language": language, "cwd": cwd, "port": port}
        # Started now, so a cwd that does not exist is refused here, not at the first cell.
        if await plane.exec(["test", "-d", cwd]):
            raise E2BError(400, "REQUEST_INVALID", f"cwd {cwd} is not a directory in the sandbox")
        await registry.kernel(plane, context, env).token()
        contexts[context_id] = context
        await registry.save(plane, contexts)
    return Response(json.dumps(_public(context)), media_type="application/json")


async def list_contexts(request: Request) -> Response:
    registry = _registry(request)
    _, plane, _ = await registry.reach(request)
    listed = [_public(c) for c in (await registry.contexts(plane)).values()]
    return Response(json.dumps(listed), media_type="application/json")


async def restart_context(request: Request) -> Response:
    registry = _registry(request)
    sandbox_id, plane, env = await registry.reach(request)
    async with registry.locks[sandbox_id]:
        kernel = registry.kernel(
            plane, await registry.context(plane, request.path_params["id"]), env
        )
        await kernel.kill()
        await kernel.token()
    return Response(status_code=204)


async def remove_context(request: Request) -> Response:
    registry = _registry(request)
    sandbox_id, plane, env = await registry.reach(request)
    context_id = request.path_params["id"]
    if context_id in {c["id"] for c in DEFAULTS.values()}:
        raise E2BError(400, "REQUEST_INVALID", "the default context cannot be removed")
    async with registry.locks[sandbox_id]:
        contexts = await registry.contexts(plane)
        context = await registry.context(plane, context_id)
        await registry.kernel(plane, context, env).kill()
        del contexts[context_id]
        await registry.save(plane, contexts)
    return Response(status_code=204)


# -- /execute ----------------------------------------------------------------------------
def _line(kind: str, **fields: Any) -> bytes:
    return json.dumps({"type": kind, **fields}).encode() + b"\n"


def _result(raw: dict[str, Any]) -> bytes:
    formats = raw.get("formats")
    formats = formats if isinstance(formats, dict) else {}
    fields = {_FIELDS[m]: v for m, v in formats.items() if m in _FIELDS}
    extra = {m: v for m, v in formats.items() if m not in _FIELDS}
    return _line("result", **fields, is_main_result=bool(raw.get("main")), extra=extra or None)


def execution_lines(payload: dict[str, Any]) -> list[bytes]:
    """The kernel's answer to one cell as E2B's stream of JSON lines."""
    now = time.time_ns()
    lines = [
        _line(stream, text=str(payload[stream]), timestamp=now)
        for stream in ("stdout", "stderr")
        if payload.get(stream)
    ]
    lines += [_result(r) for r in payload.get("results") or [] if isinstance(r, dict)]
    error = payload.get("error")
    if isinstance(error, dict):
        lines.append(
            _line(
                "error",
                name=str(error.get("name", "")),
                value=str(error.get("value", "")),
                traceback=str(error.get("traceback", "")),
            )
        )
    count = payload.get("execution_count")
    lines.append(_line("number_of_executions", execution_count=count if type(count) is int else 0))
    lines.append(_line("end_of_execution"))
    return lines


async def _cell(kernel: Kernel, body: dict[str, Any]) -> AsyncIterator[bytes]:
    try:
        async for line in _streamed(kernel, body):
            yield line
    except httpx.TransportError as exc:
        for line in execution_lines({"error": _crashed(str(exc))}):
            yield line
    except (E2BError, ApiError) as exc:
        # Refused once the answer had begun (reattaching, restarting the kernel):
        # the SDK reads it as the cell's error, not as a broken stream.
        message = exc.message
        error = {"name": "InterpreterUnavailable", "value": message, "traceback": message}
        for line in execution_lines({"error": error}):
            yield line
    except BaseException:
        # The caller went away (the SDK's ``timeout`` passed, the task was
        # cancelled): the cell stops too, so the next one does not wait for it.
        with anyio.move_on_after(10, shield=True), contextlib.suppress(httpx.HTTPError):
            await kernel.interrupt()
        raise


async def _streamed(kernel: Kernel, body: dict[str, Any]) -> AsyncIterator[bytes]:
    """The cell's output as the kernel streams it, then its results."""
    for attempt in (1, 2):
        if attempt == 2 and kernel.refresh is not None:
            kernel.plane = await kernel.refresh()
        token = await kernel.token(fresh=attempt == 2)
        try:
            async with kernel.run(token, body) as answer:
                if attempt == 1 and answer.status_code != 200:
                    # Nothing ran (the kernel answers 200 to every cell it runs): the
                    # credential was refused (the sandbox was paused, moved) or no
                    # kernel is behind the token any more. Attach again, find the
                    # kernel, retry.
                    continue
                async for line in _answer_lines(answer):
                    yield line
                return
        except httpx.ConnectError:
            if attempt == 2:
                raise  # a data plane that moved or went away: attach again (above)


async def _answer_lines(answer: httpx.Response) -> AsyncIterator[bytes]:
    if answer.status_code != 200:
        detail = (await answer.aread())[:500].decode(errors="replace")
        payload: dict[str, Any] = {"error": _crashed(f"HTTP {answer.status_code}: {detail}")}
    elif answer.headers.get("content-type", "").startswith("application/json"):
        # A kernel that does not stream (started by an older podbay).
        payload = _json_object(await answer.aread()) or {
            "error": _crashed("the interpreter's answer is not JSON")
        }
    else:
        payload = {"error": _crashed("the interpreter's answer ended early")}
        # Whole lines, as E2B sends them: print() writes its text and its
        # newline separately; the rest of a line goes with the results.
        pending = {"stdout": "", "stderr": ""}
        async for raw in answer.aiter_lines():
            item = _json_object(raw.encode()) or {}
            if isinstance(item.get("done"), dict):
                payload = {**item["done"], **pending}
            elif item.get("stream") in pending:
                name = item["stream"]
                text = pending[name] + str(item["text"])
                cut = text.rfind("\n") + 1
                pending[name] = text[cut:]
                if cut:
                    yield _line(name, text=text[:cut], timestamp=time.time_ns())
    for line in execution_lines(payload):
        yield line


def _crashed(detail: str) -> dict[str, str]:
    error = _interpreter.crashed(detail).error
    assert error is not None
    return {"name": error.name, "value": error.value, "traceback": error.traceback}


async def execute(request: Request) -> Response:
    body = await _json_body(request)
    code = body.get("code")
    if not isinstance(code, str):
        raise E2BError(400, "REQUEST_INVALID", "code must be a string")
    envs = body.get("env_vars") or {}
    if not isinstance(envs, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in envs.items()
    ):
        raise E2BError(400, "REQUEST_INVALID", "env_vars must map strings to strings")
    context_id = body.get("context_id")
    if context_id is not None and not isinstance(context_id, str):
        raise E2BError(400, "REQUEST_INVALID", "context_id must be a string")
    language = _language(body.get("language"))
    registry = _registry(request)
    sandbox_id, plane, env = await registry.reach(request, cached=True)
    async with registry.locks[sandbox_id]:
        context = (
            registry.default(language)
            if context_id is None
            else await registry.context(plane, context_id)
        )
        kernel = registry.kernel(plane, context, env)
        kernel.refresh = lambda: _fresh_plane(registry, request)
        # Started (or found) before the answer begins: a failure is a plain refusal.
        await kernel.token()
    if context["language"] == "bash":
        code, envs = f"{BASH_CELL}\nbash_cell({code!r}, {envs!r})\n", {}
    cell = {"code": code, "timeout_ms": None, "env": envs or None}
    return StreamingResponse(_cell(kernel, cell), media_type="application/x-ndjson")


async def _fresh_plane(registry: Registry, request: Request) -> Plane:
    _, plane, _ = await registry.reach(request)
    return plane


routes = [
    Route("/execute", execute, methods=["POST"]),
    Route("/contexts", create_context, methods=["POST"]),
    Route("/contexts", list_contexts, methods=["GET"]),
    Route("/contexts/{id}/restart", restart_context, methods=["POST"]),
    Route("/contexts/{id}", remove_context, methods=["DELETE"]),
    Route("/{rest:path}", envd.not_served, methods=["GET", "POST", "PUT", "PATCH", "DELETE"]),
]


def is_interpreter(scope_headers: list[tuple[bytes, bytes]]) -> bool:
    return any(
        key == PORT_HEADER.encode() and value == str(PORT).encode() for key, value in scope_headers
    )


def build(service: E2BService) -> Starlette:
    handlers = {E2BError: envd.on_e2b_error, ApiError: envd.on_api_error}
    app = Starlette(routes=routes, exception_handlers=handlers)
    app.state.registry = Registry(service)
    return app
