"""Async-only behaviour: cancelling the task that awaits ``run`` kills the process."""

from __future__ import annotations

from typing import Any

import anyio
import httpx
import pytest
from fakeplatform import Fake

from podbay.client import AsyncSandboxClient


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.anyio
async def test_cancelling_run_kills_the_process(fake: Fake) -> None:
    async with AsyncSandboxClient(
        identity_token=fake.token, transport=httpx.MockTransport(fake)
    ) as client:
        with anyio.move_on_after(0.3):
            await client.run("t", ["sleep", "30"], interval_ms=20)
            pytest.fail("run returned although it was cancelled")
        assert await client.processes("t") == []
        assert fake.count("DELETE", "") == 1
        killed: Any = [r for r in fake.requests if r.url.path.endswith("/signal")]
        assert killed


@pytest.mark.anyio
async def test_concurrent_first_calls_attach_once(fake: Fake) -> None:
    async with AsyncSandboxClient(
        identity_token=fake.token, transport=httpx.MockTransport(fake)
    ) as client:
        async with anyio.create_task_group() as tg:
            for _ in range(5):
                tg.start_soon(client.exec, "t", ["true"])
        assert fake.attaches == 1


@pytest.mark.anyio
async def test_async_handle_object(fake: Fake) -> None:
    client = AsyncSandboxClient(identity_token=fake.token, transport=httpx.MockTransport(fake))
    async with client, client.sandbox("thread-42") as sb:
        await sb.write_file("hi.txt", "hi")
        assert (await sb.exec(["cat", "hi.txt"])).stdout == "hi"
        assert (await sb.exec_combined("echo a; echo b >&2")).output == "a\nb\n"
        assert [e.name for e in await sb.list_dir()] == ["hi.txt"]
        assert [m.line for m in await sb.grep("hi")] == [1]
        run = await sb.run(["echo", "r"], interval_ms=10)
        assert run.stdout == "r\n"
        assert (await sb.get()).name == "thread-42"
        await sb.delete()
