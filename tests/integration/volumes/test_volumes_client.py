"""Volumes through the SDK (sync and async faces) and ``podbay volume``
acting for the deployment of ``ASTRO_AUTHZ_TOKEN`` (docs/volumes.md)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator

import pytest

from podbay.client import AsyncSandboxClient, SandboxClient, VolumeMount
from podbay.errors import SandboxRequestError
from podbay.testing.platform import PlatformServer, run_cli

pytestmark = pytest.mark.root


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PlatformServer]:
    with PlatformServer.start(
        tmp_path_factory.mktemp("volclient"),
        env={"PODBAY_RUNTIME_CLASSES": "container", "PODBAY_RUNTIME_WARM_POOL": "0"},
    ) as s:
        yield s


@pytest.fixture(scope="module")
def token(server: PlatformServer) -> str:
    return server.create_deployment("volclient")


def test_the_sdk_creates_mounts_reads_and_deletes_a_volume(server, token):
    with SandboxClient(identity_token=token, server_url=server.url) as client:
        created = client.create_volume("sdk", size_mib=16)
        assert (created.name, created.size_bytes) == ("sdk", 16 << 20)
        client.write_volume_file("sdk", "in/hello.txt", "from the sdk\n")
        client.attach("sdk-box", volumes={"/ro": VolumeMount(name="sdk", read_only=True)})
        assert client.exec("sdk-box", ["cat", "/ro/in/hello.txt"]).stdout == "from the sdk\n"
        # Read-only in a container too: the bind's ro flag.
        denied = client.exec("sdk-box", ["sh", "-c", "echo x > /ro/in/new"])
        assert denied.exit_code != 0
        assert "Read-only" in denied.stderr
        assert client.get("sdk-box").volumes == {"/ro": VolumeMount(name="sdk", read_only=True)}
        assert [e.name for e in client.list_volume_dir("sdk", "in")] == ["hello.txt"]
        with pytest.raises(SandboxRequestError) as refused:
            client.delete_volume("sdk")
        assert refused.value.code == "VOLUME_IN_USE"
        client.delete("sdk-box")
        assert [v.name for v in client.list_volumes()] == ["sdk"]
        client.remove_volume_path("sdk", "in")
        client.delete_volume("sdk")
        assert client.list_volumes() == []

    async def async_face() -> bytes:
        async with AsyncSandboxClient(identity_token=token, server_url=server.url) as aclient:
            await aclient.create_volume("async", size_bytes=16 << 20)
            await aclient.write_volume_file("async", "a", b"bytes")
            data = await aclient.read_volume_file("async", "a")
            await aclient.delete_volume("async")
            return data

    assert asyncio.run(async_face()) == b"bytes"


def test_the_cli_acts_for_the_tokens_deployment(server, token):
    env = {**os.environ, "ASTRO_AUTHZ_TOKEN": token, "PODBAY_SERVER_URL": server.url}
    made = run_cli(["volume", "create", "cli", "--size", "16"], env)
    assert "cli" in made.stdout
    assert run_cli(["volume", "put", "cli", "x.txt"], env, input="via cli\n").returncode == 0
    attached = run_cli(["sandbox", "create", "cli-box", "--volume", "/v=cli:ro"], env)
    assert "running" in attached.stdout
    assert run_cli(["sandbox", "exec", "cli-box", "--", "cat", "/v/x.txt"], env).stdout == (
        "via cli\n"
    )
    listed = run_cli(["volume", "ls"], env).stdout
    assert "cli-box" in listed
    busy = run_cli(["volume", "rm", "cli"], env, check=False)
    assert busy.returncode == 1
    assert "VOLUME_IN_USE" in busy.stderr
    run_cli(["sandbox", "rm", "cli-box"], env)
    assert run_cli(["volume", "cat", "cli", "x.txt"], env).stdout == "via cli\n"
    assert run_cli(["volume", "rm", "cli"], env).returncode == 0
    assert run_cli(["volume", "ls", "--json"], env).stdout.strip() == "[]"


def test_a_server_restart_keeps_volumes_and_the_sandboxes_mounting_them(server, token):
    with SandboxClient(identity_token=token, server_url=server.url) as client:
        client.create_volume("kept", size_mib=16)
        client.attach("keeper", volumes={"/k": "kept"})
        assert client.exec("keeper", ["sh", "-c", "echo before > /k/f"]).exit_code == 0
    server.restart()
    with SandboxClient(identity_token=token, server_url=server.url) as client:
        assert client.exec("keeper", ["cat", "/k/f"]).stdout == "before\n"
        assert client.read_volume_file("kept", "f") == b"before\n"
        assert client.get_volume("kept").mounted_by == ["keeper"]
        client.delete("keeper")
        client.delete_volume("kept")
