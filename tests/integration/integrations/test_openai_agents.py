"""PodbaySandboxClient for the OpenAI Agents SDK's sandbox agents, against a real
``podbay serve``: a SandboxAgent driven by the SDK's own ScriptedModel (no network,
no key) runs a command in a podbay sandbox, a second run resumes it by name, and
the session interface (exec, users, timeouts, files, workspace save/restore,
state round trip, delete) is exercised directly."""

from __future__ import annotations

import io
import tarfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from agents import RunConfig, Runner
from agents.items import ToolCallOutputItem
from agents.sandbox import SandboxAgent, SandboxRunConfig
from agents.sandbox.errors import ExecTimeoutError, WorkspaceReadNotFoundError
from agents.sandbox.manifest import Environment, Manifest
from agents.sandbox.snapshot import LocalSnapshotSpec
from agents.testing.model import ScriptedModel, assistant_message, function_call

from podbay.client import AsyncSandboxClient, SandboxClient
from podbay.errors import SandboxRequestError
from podbay.integrations.openai_agents import (
    PodbaySandboxClient,
    PodbaySandboxClientOptions,
    PodbaySandboxSessionState,
)
from podbay.testing.platform import PlatformServer

pytestmark = [pytest.mark.root, pytest.mark.anyio]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    with PlatformServer.start(tmp_path_factory.mktemp("serve-openai-agents")) as s:
        yield s.base_url, s.create_deployment("openai-agents-tests")


@pytest.fixture
def sync_client(server: tuple[str, str]) -> Iterator[SandboxClient]:
    url, token = server
    with SandboxClient(identity_token=token, server_url=url) as c:
        yield c


def podbay(server: tuple[str, str]) -> PodbaySandboxClient:
    url, token = server
    return PodbaySandboxClient(client=AsyncSandboxClient(identity_token=token, server_url=url))


def exists(client: SandboxClient, name: str) -> bool:
    try:
        client.get(name)
    except SandboxRequestError as exc:
        if exc.status != 404:
            raise
        return False
    return True


def shell_outputs(result: object) -> list[str]:
    items = getattr(result, "new_items", [])
    return [str(item.output) for item in items if isinstance(item, ToolCallOutputItem)]


async def test_a_sandbox_agent_runs_its_commands_in_podbay(
    server: tuple[str, str], sync_client: SandboxClient
) -> None:
    name = f"agents-{uuid.uuid4().hex[:8]}"
    client = podbay(server)
    options = PodbaySandboxClientOptions(name=name, delete_on_exit=False)
    agent = SandboxAgent(
        name="worker",
        instructions="Use the shell.",
        model=ScriptedModel(
            [
                [function_call("exec_command", {"cmd": "cat /etc/hostname > note.txt; pwd"},
                               call_id="c1")],
                [assistant_message("wrote the note")],
            ]
        ),
    )  # fmt: skip
    config = RunConfig(
        sandbox=SandboxRunConfig(client=client, options=options), tracing_disabled=True
    )
    result = await Runner.run(agent, "write the note", run_config=config)
    assert result.final_output == "wrote the note"
    assert any("/workspace" in out for out in shell_outputs(result)), shell_outputs(result)
    # The command ran in the podbay sandbox: its file is there, seen through our own SDK.
    hostname = sync_client.read_file(name, "/etc/hostname")
    assert sync_client.read_file(name, "/workspace/note.txt") == hostname

    # delete_on_exit=False: the sandbox outlived the run; a second run by name resumes it.
    agent.model = ScriptedModel(
        [
            [function_call("exec_command", {"cmd": "cat note.txt"}, call_id="c2")],
            [assistant_message("read it")],
        ]
    )
    again = await Runner.run(agent, "read the note", run_config=config)
    assert any(hostname.strip() in out for out in shell_outputs(again)), shell_outputs(again)

    await client.delete_sandbox(name)
    assert not exists(sync_client, name)
    await client.client.aclose()


async def test_the_session_interface(
    server: tuple[str, str], sync_client: SandboxClient, tmp_path: Path
) -> None:
    client = podbay(server)
    manifest = Manifest(environment=Environment(value={"GREETING": "hi there"}))
    session = await client.create(manifest=manifest, options=PodbaySandboxClientOptions())
    assert isinstance(session.state, PodbaySandboxSessionState)
    name = session.state.sandbox_name
    async with session:
        # exec: argv, the workspace as working directory, users, deadlines.
        done = await session.exec("pwd; echo err >&2; exit 3")
        assert (done.stdout, done.stderr, done.exit_code) == (b"/workspace\n", b"err\n", 3)
        assert (await session.exec("id", "-un", shell=False, user="user")).stdout == b"user\n"
        assert (await session.exec('echo "$GREETING"')).stdout == b"hi there\n"
        with pytest.raises(ExecTimeoutError):
            await session.exec("sleep 30", timeout=1)

        # Files both ways (relative paths are the workspace's), binary safe.
        blob = bytes(range(256)) * 64
        await session.write(Path("data/blob.bin"), io.BytesIO(blob))
        assert (await session.read(Path("/workspace/data/blob.bin"))).read() == blob
        assert sync_client.read_file_bytes(name, "/workspace/data/blob.bin") == blob
        with pytest.raises(WorkspaceReadNotFoundError):
            await session.read(Path("missing.txt"))

        # Workspace save: a tar of the workspace root.
        archive = (await session.persist_workspace()).read()
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            assert "./data/blob.bin" in tar.getnames()

        # The saved state finds the same sandbox again.
        payload = client.serialize_session_state(session.state)
        state = client.deserialize_session_state(payload)
        assert isinstance(state, PodbaySandboxSessionState)
        assert state.sandbox_name == name
        resumed = await client.resume(state)
        assert (await resumed.read(Path("data/blob.bin"))).read() == blob

    # delete_on_exit (the default): the sandbox went with the session.
    assert not exists(sync_client, name)

    # Workspace restore into a fresh sandbox.
    fresh = await client.create(options=PodbaySandboxClientOptions())
    async with fresh:
        await fresh.hydrate_workspace(io.BytesIO(archive))
        assert (await fresh.read(Path("data/blob.bin"))).read() == blob
    await client.client.aclose()


async def test_resume_after_the_sandbox_went_restores_the_snapshot(
    server: tuple[str, str], sync_client: SandboxClient, tmp_path: Path
) -> None:
    client = podbay(server)
    session = await client.create(
        snapshot=LocalSnapshotSpec(base_path=tmp_path), options=PodbaySandboxClientOptions()
    )
    async with session:  # leaving it saves the workspace to the snapshot, then deletes
        await session.write(Path("kept.txt"), io.BytesIO(b"from the first sandbox"))
        await session.exec("echo scratch > /tmp/lost.txt")
    state = session.state
    assert isinstance(state, PodbaySandboxSessionState)
    assert not exists(sync_client, state.sandbox_name)

    state = client.deserialize_session_state(client.serialize_session_state(state))
    resumed = await client.resume(state)
    async with resumed:
        # A fresh sandbox of the same name, its workspace restored from the snapshot.
        assert (await resumed.read(Path("kept.txt"))).read() == b"from the first sandbox"
        assert (await resumed.exec("test -e /tmp/lost.txt")).exit_code == 1
        assert exists(sync_client, state.sandbox_name)
    await client.client.aclose()
