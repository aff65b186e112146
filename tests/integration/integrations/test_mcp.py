"""``podbay mcp`` driven by the official ``mcp`` package's own client, over stdio and
streamable HTTP, against a real ``podbay serve`` and real sandboxes."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from typing import Any

import anyio
import httpx
import httpx2
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from podbay.client import SandboxClient
from podbay.testing.platform import PlatformServer, free_port

pytestmark = pytest.mark.root

TOOLS = {
    "attach",
    "list_sandboxes",
    "exec",
    "run",
    "read_file",
    "read_file_base64",
    "write_file",
    "list_dir",
    "grep",
    "spawn",
    "processes",
    "read_process",
    "kill_process",
    "run_code",
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PlatformServer]:
    with PlatformServer.start(tmp_path_factory.mktemp("serve-mcp")) as s:
        yield s


@pytest.fixture(scope="module")
def token(server: PlatformServer) -> str:
    return server.create_deployment("mcp-tests")


@pytest.fixture
def name(server: PlatformServer, token: str) -> Iterator[str]:
    sandbox = f"mcp-{uuid.uuid4().hex[:8]}"
    yield sandbox
    with SandboxClient(identity_token=token, server_url=server.base_url) as client:
        client.delete(sandbox)


def payload(result: Any) -> Any:
    assert not result.is_error, result.content
    if result.structured_content is not None:
        content = result.structured_content
        return content.get("result", content) if set(content) == {"result"} else content
    return json.loads(result.content[0].text)


async def exercise(client: Client, sandbox: str) -> None:
    listed = await client.list_tools()
    assert {tool.name for tool in listed.tools} >= TOOLS
    exec_tool = next(t for t in listed.tools if t.name == "exec")
    assert {"sandbox", "command"} <= set(exec_tool.input_schema["required"])
    # As the README says: every tool but list_sandboxes takes `sandbox`.
    assert [
        t.name for t in listed.tools if "sandbox" not in t.input_schema.get("required", [])
    ] == ["list_sandboxes"]

    ran = payload(
        await client.call_tool(
            "exec",
            {"sandbox": sandbox, "command": ["sh", "-c", "echo hello from $(hostname); exit 3"]},
        )
    )
    assert ran["exit_code"] == 3
    assert ran["stdout"].startswith("hello from ")

    payload(
        await client.call_tool(
            "write_file", {"sandbox": sandbox, "path": "notes/a.txt", "content": "alpha\nbeta\n"}
        )
    )
    assert (
        payload(await client.call_tool("read_file", {"sandbox": sandbox, "path": "notes/a.txt"}))
        == "alpha\nbeta\n"
    )
    matches = payload(
        await client.call_tool("grep", {"sandbox": sandbox, "pattern": "bet", "path": "notes"})
    )
    assert [(m["line"], m["text"]) for m in matches] == [(2, "beta")]
    entries = payload(await client.call_tool("list_dir", {"sandbox": sandbox, "path": "notes"}))
    assert [e["name"] for e in entries] == ["a.txt"]


#: A cell that displays a 1x1 PNG (any object with ``_repr_png_``, as a matplotlib
#: figure is): the interpreter's image path without needing matplotlib installed.
PNG_CELL = """
import struct, zlib
def chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
header = struct.pack(">IIBBBBB", 1, 1, 8, 0, 0, 0, 0)
class Dot:
    def _repr_png_(self):
        return (b"\\x89PNG\\r\\n\\x1a\\n" + chunk(b"IHDR", header)
                + chunk(b"IDAT", zlib.compress(b"\\x00\\x80")) + chunk(b"IEND", b""))
Dot()
"""


async def failures_and_images(client: Client, sandbox: str) -> None:
    # A refusal reaches the client as an error result with its code and message.
    missing = await client.call_tool("read_file", {"sandbox": sandbox, "path": "no/such.txt"})
    assert missing.is_error
    text = missing.content[0].text
    assert "PATH_NOT_FOUND" in text, text
    assert "no/such.txt" in text, text
    bad = await client.call_tool("exec", {"sandbox": "bad name!", "command": ["true"]})
    assert bad.is_error, bad.content
    assert "400 SANDBOX_NAME_INVALID" in bad.content[0].text, bad.content
    # A displayed image arrives as MCP image content, beside the summary.
    drawn = await client.call_tool("run_code", {"sandbox": sandbox, "code": PNG_CELL})
    assert not drawn.is_error, drawn.content
    assert payload(drawn)["images"] == 1
    images = [c for c in drawn.content if c.type == "image"]
    assert [c.mime_type for c in images] == ["image/png"]
    assert base64.b64decode(images[0].data).startswith(b"\x89PNG\r\n\x1a\n")


def test_stdio_lists_tools_and_runs_a_command(
    server: PlatformServer, token: str, name: str
) -> None:
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "podbay.cli.main", "mcp"],
        env={**os.environ, "ASTRO_AUTHZ_TOKEN": token},
    )
    live: list[str] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        live.append(message or "")

    async def main() -> None:
        async with Client(params) as client:
            await exercise(client, name)
            # run: the output arrives as progress messages while the command runs.
            result = payload(
                await client.call_tool(
                    "run",
                    {"sandbox": name, "command": ["sh", "-c", "echo first; sleep 1; echo second"]},
                    progress_callback=on_progress,
                )
            )
            assert result["stdout"] == "first\nsecond\n"
            assert result["exit_code"] == 0
            code = payload(
                await client.call_tool("run_code", {"sandbox": name, "code": "x = 20\nx + 22"})
            )
            assert code["result"] == "42"
            assert code["error"] is None
            await failures_and_images(client, name)

    anyio.run(main)
    # Two chunks a second apart: the first was sent before the command ended.
    assert live == ["first\n", "second\n"]


def test_streamable_http_needs_its_secret(server: PlatformServer, token: str, name: str) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "PODBAY_MCP_SECRET"}
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "podbay.cli.main",
            "mcp",
            "--transport",
            "http",
            "--port",
            str(port),
        ],
        env={**env, "ASTRO_AUTHZ_TOKEN": token},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}/mcp"
    try:
        assert process.stderr is not None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                refused = httpx.post(url, json={}, timeout=2)
                break
            except httpx.TransportError:
                assert process.poll() is None, process.stderr.read()
                time.sleep(0.1)
        assert refused.status_code == 401
        assert refused.json()["code"] == "CREDENTIAL_INVALID"
        # The secret was printed once, before the server listened.
        line = process.stderr.readline().decode()
        secret = line.split("Bearer ", 1)[1].split("'", 1)[0]
        wrong = httpx.post(url, json={}, headers={"Authorization": f"Bearer {secret}x"})
        assert wrong.status_code == 401

        async def without() -> None:
            async with Client(url) as client:
                await client.list_tools()

        # The mcp client's own error for a 401, raised out of its task groups.
        with pytest.raises(ExceptionGroup) as refusal:
            anyio.run(without)
        assert refusal.group_contains(MCPError, match="Server returned an error response")

        async def main() -> None:
            headers = {"Authorization": f"Bearer {secret}"}
            async with (
                httpx2.AsyncClient(headers=headers) as http,
                Client(streamable_http_client(url, http_client=http)) as client,
            ):
                await exercise(client, name)

        anyio.run(main)
    finally:
        process.terminate()
        process.wait(20)
        if process.stderr is not None:
            process.stderr.close()
