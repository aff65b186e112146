"""The egress policy end to end: ``podbay serve``, real sandboxes (container and
gvisor), attach's ``network``, ``PUT .../network`` through the SDK and the CLI,
and the test host (tests/integration/network/conftest.py) standing in for the
internet."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from _nethelpers import PROBE, NetLab

from podbay.client import NetworkPolicy, SandboxClient
from podbay.errors import SandboxRequestError
from podbay.testing.platform import PlatformServer

CLASSES = ["container", "gvisor"]
PODBAY = str(Path(sys.executable).parent / "podbay")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, testnet: NetLab) -> Iterator[PlatformServer]:
    env = {"PODBAY_RUNTIME_CLASSES": "gvisor,container"}
    with PlatformServer.start(tmp_path_factory.mktemp("egress"), env=env) as s:
        s.wait_classes(*CLASSES)
        yield s


@pytest.fixture(scope="module")
def token(server: PlatformServer) -> str:
    return server.create_deployment("egress-agent")


@pytest.fixture
def client(server: PlatformServer, token: str) -> Iterator[SandboxClient]:
    with SandboxClient(identity_token=token, server_url=server.base_url) as c:
        yield c


def probe(client: SandboxClient, name: str, targets: list[tuple[str, str, int, str]]) -> list[str]:
    done = client.exec(name, ["python3", "-c", PROBE, json.dumps(targets)], timeout_ms=30_000)
    assert done.exit_code == 0, done.stderr
    return [result for result, _ in json.loads(done.stdout)]


def cli(server: PlatformServer, token: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PODBAY, "sandbox", *args, "--server", server.base_url],
        capture_output=True,
        text=True,
        env={**os.environ, "ASTRO_AUTHZ_TOKEN": token},
        timeout=180,
        check=False,
    )


@pytest.mark.parametrize("class_", CLASSES)
def test_a_policy_from_attach_to_a_live_change(
    class_: str, server: PlatformServer, token: str, client: SandboxClient, testnet: NetLab
) -> None:
    # gVisor's packets meet the netdev hook, which can only drop: a timeout.
    refused = {"ECONNREFUSED", "EPERM", "timeout"} if class_ == "gvisor" else {"ECONNREFUSED"}
    name = f"egress-{class_}-{uuid.uuid4().hex[:6]}"
    testhost = ("tcp", testnet.testhost_address, testnet.testhost_port, "")
    elsewhere = ("tcp", testnet.testhost_address.rsplit(".", 1)[0] + ".250", 80, "")
    allowed = NetworkPolicy(allow=[testnet.testhost_address])
    client.attach(name, class_, network=allowed)
    try:
        results = probe(client, name, [testhost, elsewhere])
        assert results[0] == "connected:testhost\n"
        assert results[1] in refused, results
        assert client.network(name).allow == [f"{testnet.testhost_address}/32"]

        # The CLI's change is in force when it returns: no wait before the probe.
        done = cli(server, token, "network", name, "--no-internet")
        assert done.returncode == 0, done.stderr
        assert "no egress" in done.stdout
        assert probe(client, name, [testhost])[0] in refused
        # Kept over a suspend and a resume (the next call).
        client.stop(name)
        assert probe(client, name, [testhost])[0] in refused
        assert cli(server, token, "network", name).stdout.strip().startswith("internet: no")

        client.set_network(name)  # open
        assert probe(client, name, [testhost])[0] == "connected:testhost\n"
        with pytest.raises(SandboxRequestError) as caught:
            client.set_network(name, deny=["203.0.113.0/33"])
        assert caught.value.code == "SANDBOX_NETWORK_ENTRY_INVALID"
        assert client.network(name) == NetworkPolicy()
        # Each change is in the sandbox's events (docs/observability.md); the
        # refused one is not.
        changes = [e.reason for e in client.events(name).events if e.kind == "policy_changed"]
        assert changes == ['egress {"internet":false}', "egress open"], changes
    finally:
        client.delete(name)
