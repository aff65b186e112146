"""podbay as Model Context Protocol tools (``podbay mcp``), with the official ``mcp`` package.

    podbay mcp                                # stdio: for Claude Desktop, IDEs, any MCP host
    podbay mcp --transport http --port 8765   # streamable HTTP on http://127.0.0.1:8765/mcp

Every tool names its sandbox (``sandbox``): it is created, resumed or reused
by that name on first use, like every SDK call. The server holds ONE
identity token (``ASTRO_AUTHZ_TOKEN`` or ``--token``), so whoever can talk to
it can use that deployment's sandboxes. The HTTP transport therefore listens
on loopback unless told otherwise AND answers only requests that carry its
secret, ``Authorization: Bearer <secret>`` (401 otherwise): any local user
can reach a loopback port. The secret is ``$PODBAY_MCP_SECRET`` when set,
else generated at start and printed once, to stderr.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import hmac
import json
import logging
import os
import secrets
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, ParamSpec, TypeVar

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import CallToolResult, ContentBlock, ImageContent, TextContent

from podbay.asgi import ASGIApp, Receive, Scope, Send
from podbay.client import AsyncSandboxClient, Execution, ProcessOutput
from podbay.errors import PodbayError, SandboxRequestError

#: Where the HTTP transport's secret comes from when set (else one is generated).
SECRET_ENV = "PODBAY_MCP_SECRET"

INSTRUCTIONS = (
    "Each tool runs in a podbay sandbox named by its `sandbox` argument: an isolated Linux "
    "machine created on first use and kept (files included) under that name. Commands are "
    "argv lists (use ['sh', '-c', '...'] for a shell line); relative paths are under "
    "/workspace."
)


P = ParamSpec("P")
R = TypeVar("R")


def reason(exc: Exception) -> str:
    """What the MCP client reads when a tool fails: the server's status, code
    and message (``404 PATH_NOT_FOUND: ...``), or the client's own refusal."""
    if isinstance(exc, SandboxRequestError):
        return str(exc)
    return f"{type(exc).__name__}: {exc}"


def _with_reasons(fn: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
    """The tool, its anticipated failures raised as ToolError: the MCP server
    hands a ToolError's text to the client as an error result, where any other
    exception reaches it as only "Error executing tool NAME" (the reason left in
    the server's log)."""

    @functools.wraps(fn)
    async def tool(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return await fn(*args, **kwargs)
        except (PodbayError, ValueError) as exc:
            raise ToolError(reason(exc)) from exc

    return tool


def code_result(execution: Execution) -> CallToolResult:
    """run_code's answer: the summary as text (and structured), then each PNG
    the cell displayed as MCP image content, which a host shows or hands to
    its model."""
    error = execution.error
    pngs = [r.formats["image/png"] for r in execution.results if r.png is not None]
    summary = {
        "stdout": execution.stdout,
        "stderr": execution.stderr,
        "result": execution.text,
        "error": None
        if error is None
        else {"name": error.name, "value": error.value, "traceback": error.traceback},
        "images": len(pngs),
        "restarted": execution.restarted,
    }
    content: list[ContentBlock] = [TextContent(text=json.dumps(summary, indent=2))]
    content += [ImageContent(data=png, mime_type="image/png") for png in pngs]
    return CallToolResult(content=content, structured_content=summary)


def _status(status: Any) -> dict[str, Any]:
    return {
        "process_id": status.process_id,
        "state": status.state,
        "exit_code": status.exit_code,
        "command": list(status.command),
    }


def build_server(client: AsyncSandboxClient) -> MCPServer:
    """An MCP server whose tools act on ``client``'s sandboxes."""

    @asynccontextmanager
    async def lifespan(_: MCPServer) -> AsyncIterator[None]:
        try:
            yield None
        finally:
            await client.aclose()

    server: MCPServer = MCPServer("podbay", instructions=INSTRUCTIONS, lifespan=lifespan)

    def tool(fn: Callable[P, Awaitable[R]]) -> Callable[P, Awaitable[R]]:
        return server.tool()(_with_reasons(fn))

    @tool
    async def attach(sandbox: str) -> dict[str, Any]:
        """Create, resume or reuse the sandbox by name; returns its state and class."""
        handle = await client.attach(sandbox)
        return {
            "sandbox": sandbox,
            "state": handle.state,
            "class": handle.class_,
            "runtime_class": handle.runtime_class,
            "start": handle.start,
        }

    @tool
    async def list_sandboxes() -> list[dict[str, Any]]:
        """Every sandbox of this deployment with its state."""
        return [
            {"name": r.name, "state": r.state, "class": r.class_, "runtime_class": r.runtime_class}
            for r in await client.list()
        ]

    @tool
    async def exec(
        sandbox: str, command: list[str], cwd: str | None = None, timeout_ms: int | None = None
    ) -> dict[str, Any]:
        """Run a command (argv) to completion; returns exit code, stdout and stderr."""
        result = await client.exec(sandbox, command, cwd=cwd, timeout_ms=timeout_ms)
        return {
            "exit_code": result.exit_code,
            "stdout": result.stdout,
            "stderr": result.stderr,
            "timed_out": result.timed_out,
            "truncated": result.truncated,
        }

    @tool
    async def run(
        sandbox: str,
        command: list[str],
        ctx: Context,
        cwd: str | None = None,
        timeout_ms: int | None = None,
    ) -> dict[str, Any]:
        """Run a command (argv) with its output sent live while it runs (progress
        notifications whose message is the new output; progress counts characters);
        returns the whole output and exit code. No output cap."""
        send, receive = anyio.create_memory_object_stream[ProcessOutput](max_buffer_size=1024)

        def on_output(chunk: ProcessOutput) -> None:
            # A host that reads slowly loses live chunks, never the result's output.
            with contextlib.suppress(anyio.WouldBlock):
                send.send_nowait(chunk)

        async def forward() -> None:
            received = 0
            async with receive:
                async for chunk in receive:
                    text = chunk.stdout + chunk.stderr
                    if text:
                        received += len(text)
                        await ctx.report_progress(received, None, text)

        async with anyio.create_task_group() as tasks:
            tasks.start_soon(forward)
            async with send:
                result = await client.run(
                    sandbox,
                    command,
                    cwd=cwd,
                    timeout_ms=timeout_ms,
                    on_output=on_output,
                    interval_ms=200,
                )
        return {
            "exit_code": result.exit_code,
            "stdout": result.stdout,
            "stderr": result.stderr,
            "timed_out": result.timed_out,
            "killed": result.killed,
        }

    @tool
    async def read_file(sandbox: str, path: str) -> str:
        """A file's contents as text (undecodable bytes replaced)."""
        return await client.read_file(sandbox, path)

    @tool
    async def read_file_base64(sandbox: str, path: str) -> str:
        """A file's exact bytes, base64-encoded (for binary files)."""
        return base64.b64encode(await client.read_file_bytes(sandbox, path)).decode()

    @tool
    async def write_file(sandbox: str, path: str, content: str) -> str:
        """Write text to a file, replacing it whole."""
        await client.write_file(sandbox, path, content)
        return f"wrote {len(content.encode())} bytes to {path}"

    @tool
    async def list_dir(sandbox: str, path: str = ".") -> list[dict[str, Any]]:
        """A directory's entries."""
        return [
            {"name": e.name, "is_directory": e.is_directory}
            for e in await client.list_dir(sandbox, path)
        ]

    @tool
    async def grep(sandbox: str, pattern: str, path: str = ".") -> list[dict[str, Any]]:
        """Lines matching a regular expression under a path (grep -rn)."""
        return [
            {"path": m.path, "line": m.line, "text": m.text}
            for m in await client.grep(sandbox, pattern, path)
        ]

    @tool
    async def spawn(sandbox: str, command: list[str], cwd: str | None = None) -> dict[str, Any]:
        """Start a command in the background; read its output with read_process."""
        return _status(await client.spawn(sandbox, command, cwd=cwd))

    @tool
    async def processes(sandbox: str) -> list[dict[str, Any]]:
        """The processes the sandbox tracks (running, or exited and not yet killed)."""
        return [_status(p) for p in await client.processes(sandbox)]

    @tool
    async def read_process(
        sandbox: str, process_id: str, stdout_from: int = 0, stderr_from: int = 0
    ) -> dict[str, Any]:
        """A process's state and its output after the given offsets (pass back *_next)."""
        out = await client.poll(
            sandbox, process_id, stdout_from=stdout_from, stderr_from=stderr_from
        )
        return {
            **_status(out),
            "stdout": out.stdout,
            "stderr": out.stderr,
            "stdout_next": out.stdout_next,
            "stderr_next": out.stderr_next,
        }

    @tool
    async def kill_process(sandbox: str, process_id: str) -> str:
        """Stop a process if it still runs, then forget it."""
        await client.kill(sandbox, process_id)
        return f"killed {process_id}"

    @tool
    async def run_code(sandbox: str, code: str, timeout_ms: int | None = None) -> CallToolResult:
        """Run Python in the sandbox's stateful interpreter (variables persist between calls);
        returns stdout, stderr, the last expression's repr, any error, and each figure the
        code displayed (matplotlib) as a PNG image."""
        return code_result(await client.run_code(sandbox, code, timeout_ms=timeout_ms))

    return server


async def serve(
    client: AsyncSandboxClient,
    transport: str = "stdio",
    *,
    host: str = "127.0.0.1",
    port: int = 8765,
    path: str = "/mcp",
) -> None:
    """Serve the tools over ``stdio`` or streamable ``http`` until the host hangs up."""
    server = build_server(client)
    # One line per SDK request on stderr is noise in an MCP host's log.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    if transport == "stdio":
        await server.run_stdio_async()
        return
    import uvicorn

    secret = os.environ.get(SECRET_ENV) or ""
    if not secret:
        secret = secrets.token_urlsafe(32)
        print(
            f"podbay mcp: send 'Authorization: Bearer {secret}' with every request"
            f" to http://{host}:{port}{path} (shown once; set ${SECRET_ENV} to choose it)",
            file=sys.stderr,
            flush=True,
        )
    app = BearerSecret(server.streamable_http_app(streamable_http_path=path, host=host), secret)
    config = uvicorn.Config(app, host=host, port=port, log_level="warning")
    await uvicorn.Server(config).serve()


class BearerSecret:
    """Answer 401 to an HTTP request without ``Authorization: Bearer <secret>``
    (compared in constant time); lifespan and the rest pass through."""

    def __init__(self, app: ASGIApp, secret: str) -> None:
        self.app = app
        self.expected = f"Bearer {secret}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket" and not self._allowed(scope):
            await send({"type": "websocket.close", "code": 1008})
            return
        if scope["type"] == "http" and not self._allowed(scope):
            body = json.dumps(
                {"error": "send the server's secret: Authorization: Bearer <secret>",
                 "code": "CREDENTIAL_INVALID"}
            ).encode()  # fmt: skip
            await send(
                {
                    "type": "http.response.start",
                    "status": 401,
                    "headers": [
                        (b"content-type", b"application/json"),
                        (b"content-length", str(len(body)).encode()),
                        (b"www-authenticate", b"Bearer"),
                    ],
                }
            )
            await send({"type": "http.response.body", "body": body})
            return
        await self.app(scope, receive, send)

    def _allowed(self, scope: Scope) -> bool:
        given = [v for k, v in scope["headers"] if k == b"authorization"]
        return len(given) == 1 and hmac.compare_digest(bytes(given[0]), self.expected)
