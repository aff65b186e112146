"""Fork (issue 27, docs/fork.md) end to end: ``podbay serve`` with real
sandboxes (container and gvisor; vm in one case, TCG being slow), the HTTP
API, the SDK and the CLI. One server for the module."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from podbay.client import SandboxClient
from podbay.errors import SandboxRequestError
from podbay.testing.platform import PlatformServer
from podbay.wire.paths import sandbox_fork_path

pytestmark = pytest.mark.root

CLASSES = ["container", "gvisor"]
PODBAY = str(Path(sys.executable).parent / "podbay")
#: Connects to each (host, port) and prints what happened, one word per line.
CONNECT = r"""
import socket, sys
for target in sys.argv[1:]:
    host, port = target.rsplit(":", 1)
    s = socket.socket()
    s.settimeout(3)
    try:
        s.connect((host, int(port)))
        print("connected")
    except OSError as e:
        print(type(e).__name__)
    finally:
        s.close()
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PlatformServer]:
    classes = [*CLASSES, "vm"]
    env = {"PODBAY_RUNTIME_CLASSES": ",".join(classes), "PODBAY_CAPS_PER_DEPLOYMENT": "40"}
    with PlatformServer.start(tmp_path_factory.mktemp("fork"), env=env) as s:
        s.wait_classes(*classes, within=900)
        yield s


@pytest.fixture(scope="module")
def token(server: PlatformServer) -> str:
    return server.create_deployment("fork-agent")


@pytest.fixture
def client(server: PlatformServer, token: str) -> Iterator[SandboxClient]:
    with SandboxClient(identity_token=token, server_url=server.base_url) as c:
        yield c


def _name(what: str) -> str:
    return f"{what}-{uuid.uuid4().hex[:6]}"


def _sh(client: SandboxClient, name: str, script: str) -> str:
    done = client.exec(name, ["sh", "-c", script], timeout_ms=60_000)
    assert done.exit_code == 0, done.stderr
    return done.stdout


def cli(server: PlatformServer, token: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PODBAY, "sandbox", *args, "--server", server.base_url],
        capture_output=True,
        text=True,
        env={**os.environ, "ASTRO_AUTHZ_TOKEN": token},
        timeout=300,
        check=False,
    )


@pytest.mark.parametrize("class_", CLASSES)
def test_a_fork_has_the_files_then_diverges_and_is_a_sandbox_of_its_own(
    class_: str, client: SandboxClient
) -> None:
    source, copy = _name(f"src-{class_}"), _name(f"fork-{class_}")
    source_handle = client.attach(source, class_, env={"FROM": "source"}, memory_mib=512)
    _sh(client, source, "mkdir -p /work && echo before > /work/state && sync")
    _sh(client, source, "echo unsynced > /work/late")  # not synced: the fork holds it too
    result = client.fork(source, copy)
    assert [h.name for h in result.sandboxes] == [copy]
    assert result.processes is False
    assert result.paused_ms > 0  # a running source was held still
    fork = result.sandboxes[0]
    assert fork.runtime_class == class_
    assert fork.state == "running"
    assert _sh(client, copy, "cat /work/state /work/late") == "before\nunsynced\n"
    # The same environment and limits.
    assert _sh(client, copy, "echo $FROM") == "source\n"
    assert client.get(copy).memory_mib == 512
    # From now on the two diverge, both ways.
    _sh(client, source, "echo source-only > /work/state")
    _sh(client, copy, "echo fork-only > /work/mine")
    assert _sh(client, copy, "cat /work/state") == "before\n"
    assert _sh(client, source, "test -e /work/mine && echo yes || echo no") == "no\n"
    # Its own hostname.
    assert _sh(client, copy, "hostname").strip() == copy.lower()
    assert _sh(client, source, "hostname").strip() == source.lower()
    # Its own credentials: the source's do not reach the fork, nor the fork's the source.
    for handle, other in ((source_handle, fork), (fork, source_handle)):
        r = httpx.get(f"{other.endpoint}/v1/info", headers=handle.headers, timeout=30)
        assert r.status_code in (401, 403), r.text
        assert r.json()["code"] == "CREDENTIAL_WRONG_SANDBOX"
    # The source runs on: still its own.
    assert _sh(client, source, "cat /work/state") == "source-only\n"
    # Its own record: a new sandbox, and the source's events tell of the fork.
    assert client.get(copy).created_at > client.get(source).created_at
    assert any(e.kind == "forked" for e in client.events(source).events)


@pytest.mark.parametrize("class_", CLASSES)
def test_the_source_and_its_fork_cannot_reach_each_other(
    class_: str, client: SandboxClient
) -> None:
    source, copy = _name(f"net-{class_}"), _name(f"netf-{class_}")
    client.attach(source, class_)
    client.fork(source, copy)
    port = 8765
    # A server in the source, listening on every address; reached from inside it.
    client.spawn(source, ["python3", "-m", "http.server", str(port), "--bind", "0.0.0.0"])
    address = _sh(client, source, "hostname -I 2>/dev/null || true").split()
    targets = [f"127.0.0.1:{port}", *(f"{a}:{port}" for a in address if ":" not in a)]
    for _ in range(100):
        if "connected" in _sh(client, source, f"python3 -c '{CONNECT}' 127.0.0.1:{port}"):
            break
    else:
        pytest.fail("the source's server never listened")
    seen = _sh(client, copy, f"python3 -c '{CONNECT}' {' '.join(targets)}").split()
    assert seen, "no target was tried"
    assert "connected" not in seen, seen
    # Each has its own network namespace (as the host kernel sees it for container).
    if class_ == "container":
        mine = _sh(client, copy, "readlink /proc/self/ns/net")
        theirs = _sh(client, source, "readlink /proc/self/ns/net")
        assert mine != theirs
    # The egress policy was copied: the fork's is the source's.
    assert client.network(copy) == client.network(source)


@pytest.mark.parametrize("class_", CLASSES)
def test_n_copies_in_one_call_from_a_suspended_source(
    class_: str, client: SandboxClient, server: PlatformServer, token: str
) -> None:
    source = _name(f"many-{class_}")
    copies = [_name(f"c{i}-{class_}") for i in range(3)]
    client.attach(source, class_)
    _sh(client, source, "echo shared > /root/shared && sync")
    client.stop(source)
    assert client.get(source).state == "suspended"
    done = cli(server, token, "fork", source, *copies, "--json")
    assert done.returncode == 0, done.stderr
    assert client.get(source).state == "suspended"  # left as it was
    for copy in copies:
        assert client.get(copy).state == "running"
        assert _sh(client, copy, "cat /root/shared") == "shared\n"
    hostnames = {_sh(client, copy, "hostname").strip() for copy in copies}
    assert len(hostnames) == 3


def test_refusals_through_the_api_and_the_cli(
    client: SandboxClient, server: PlatformServer, token: str
) -> None:
    source, taken = _name("refuse"), _name("taken")
    client.attach(source, "container")
    client.attach(taken, "container")
    http = httpx.Client(
        base_url=server.base_url, headers={"Authorization": f"Bearer {token}"}, timeout=60
    )
    with http:
        _refusals(http, client, server, token, source, taken)


def _refusals(
    http: httpx.Client,
    client: SandboxClient,
    server: PlatformServer,
    token: str,
    source: str,
    taken: str,
) -> None:
    cases: list[tuple[str, object, int, str]] = [
        (_name("nobody"), {"name": _name("x")}, 404, "SANDBOX_NOT_FOUND"),
        (source, {"name": taken}, 409, "SANDBOX_NAME_TAKEN"),
        (source, {"name": source}, 409, "SANDBOX_NAME_TAKEN"),
        (source, {"name": "../bad"}, 400, "SANDBOX_NAME_INVALID"),
        (source, {"names": [f"n{i}" for i in range(17)]}, 400, "SANDBOX_FORK_INVALID"),
        (source, {"names": []}, 400, "SANDBOX_FORK_INVALID"),
        (source, {"names": ["dup", "dup"]}, 400, "SANDBOX_FORK_INVALID"),
        (source, {}, 400, "SANDBOX_FORK_INVALID"),
        (source, {"name": "a", "names": ["b"]}, 400, "SANDBOX_FORK_INVALID"),
        (source, {"name": 5}, 400, "REQUEST_INVALID"),
        (source, {"nme": "x"}, 400, "REQUEST_INVALID"),
        ("-bad", {"name": "x"}, 400, "SANDBOX_NAME_INVALID"),
    ]
    for name, body, status, code in cases:
        r = http.post(sandbox_fork_path(name), json=body)
        assert (r.status_code, r.json().get("code")) == (status, code), (name, body, r.text)
    r = http.post(sandbox_fork_path(source), content=b"{not json")
    assert (r.status_code, r.json()["code"]) == (400, "REQUEST_INVALID")
    # A taken name among free ones: nothing of the free ones is left.
    free = _name("free")
    r = http.post(sandbox_fork_path(source), json={"names": [free, taken]})
    assert r.status_code == 409
    with pytest.raises(SandboxRequestError) as missing:
        client.get(free)
    assert missing.value.code == "SANDBOX_NOT_FOUND"
    # The CLI: the server's refusal on one line, exit 1.
    done = cli(server, token, "fork", source, taken)
    assert done.returncode == 1
    assert "409 SANDBOX_NAME_TAKEN" in done.stderr
    done = cli(server, token, "fork", _name("nobody"), _name("x"))
    assert done.returncode == 1
    assert "404 SANDBOX_NOT_FOUND" in done.stderr
    # The SDK says the same.
    with pytest.raises(SandboxRequestError) as refused:
        client.fork(source, taken)
    assert refused.value.code == "SANDBOX_NAME_TAKEN"


def test_a_vm_fork_has_the_files_and_diverges(client: SandboxClient) -> None:
    source, copy = _name("src-vm"), _name("fork-vm")
    client.attach(source, "vm")
    _sh(client, source, "echo before > /root/state")  # in the guest's page cache
    result = client.fork(source, copy)
    assert result.sandboxes[0].runtime_class == "vm"
    assert _sh(client, copy, "cat /root/state") == "before\n"
    _sh(client, source, "echo after > /root/state")
    assert _sh(client, copy, "cat /root/state") == "before\n"
    assert _sh(client, copy, "hostname").strip() == copy.lower()
