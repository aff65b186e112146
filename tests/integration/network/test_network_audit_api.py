"""The egress audit end to end: ``podbay serve`` with every class, a real
sandbox per class with an allow list, ``GET .../egress`` through the SDK and
``podbay sandbox egress`` (table and ``--json``), the test host
(tests/integration/network/conftest.py) standing in for the internet. Names
are shown at the driver level (test_network_audit_sandbox.py,
test_network_vm.py): a served node asks the host's resolver, not the test's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from _nethelpers import NetLab

from podbay.client import NetworkPolicy, SandboxClient
from podbay.testing.platform import PlatformServer

CLASSES = ["container", "gvisor", "vm"]
PODBAY = str(Path(sys.executable).parent / "podbay")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, testnet: NetLab) -> Iterator[PlatformServer]:
    env = {
        "PODBAY_RUNTIME_CLASSES": "gvisor,container,vm",
        "PODBAY_RUNTIME_MEMORY_BYTES": str(512 << 20),
    }
    with PlatformServer.start(tmp_path_factory.mktemp("audit"), env=env) as s:
        s.wait_classes(*CLASSES)
        yield s


@pytest.fixture(scope="module")
def token(server: PlatformServer) -> str:
    return server.create_deployment("audit-agent")


@pytest.fixture
def client(server: PlatformServer, token: str) -> Iterator[SandboxClient]:
    with SandboxClient(identity_token=token, server_url=server.base_url) as c:
        yield c


def connect(client: SandboxClient, name: str, host: str, port: int) -> str:
    """What a TCP connect from inside gets: the first line, or ``failed``."""
    script = f"exec 3<>/dev/tcp/{host}/{port} && head -n1 <&3"
    done = client.exec(name, ["timeout", "5", "bash", "-c", script], timeout_ms=30_000)
    return done.stdout.strip() if done.exit_code == 0 else "failed"


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
def test_the_audit_through_the_api_and_the_cli(
    class_: str, server: PlatformServer, token: str, client: SandboxClient, testnet: NetLab
) -> None:
    name = f"audit-{class_}-{uuid.uuid4().hex[:6]}"
    other = testnet.testhost_address.rsplit(".", 1)[0] + ".250"
    client.attach(name, class_, network=NetworkPolicy(allow=[testnet.testhost_address]))
    try:
        assert connect(client, name, testnet.testhost_address, testnet.testhost_port) == "testhost"
        assert connect(client, name, other, 81) == "failed"
        rows = client.egress(name).destinations
        by_key = {(d.address, d.port, d.verdict): d for d in rows}
        reached = by_key[(testnet.testhost_address, testnet.testhost_port, "reached")]
        assert reached.protocol == "tcp"
        assert reached.bytes > 0
        assert reached.name is None  # no domain rule: no resolver, no name
        refused = by_key[(other, 81, "refused")]
        assert refused.packets >= 1

        table = cli(server, token, "egress", name)
        assert table.returncode == 0, table.stderr
        lines = table.stdout.splitlines()
        assert lines[0].split() == [
            "VERDICT", "NAME", "ADDRESS", "PORT", "PROTOCOL", "PACKETS", "BYTES", "LAST", "SEEN",
        ]  # fmt: skip
        shown = {(cells[2], cells[3], cells[0]) for cells in (line.split() for line in lines[1:])}
        assert (testnet.testhost_address, str(testnet.testhost_port), "reached") in shown
        assert (other, "81", "refused") in shown
        as_json = cli(server, token, "egress", name, "--json")
        assert as_json.returncode == 0, as_json.stderr
        doc = json.loads(as_json.stdout)
        assert {(d["address"], d["port"], d["verdict"]) for d in doc["destinations"]} >= {
            (testnet.testhost_address, testnet.testhost_port, "reached"),
            (other, 81, "refused"),
        }
        # Suspended, the sandbox keeps its namespace and so its audit.
        client.stop(name)
        kept = {(d.address, d.port, d.verdict) for d in client.egress(name).destinations}
        assert (testnet.testhost_address, testnet.testhost_port, "reached") in kept
    finally:
        client.delete(name)
