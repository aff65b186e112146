"""E2B's network options through E2B's own SDK, enforced by podbay's egress
policy (podbay.e2b.network maps them): ``allow_internet_access=False``,
``network={"allow_out": ..., "deny_out": [ALL_TRAFFIC]}``, ``update_network``
and ``get_info``'s view, against a test host (podbay.testing.upstream) with
two addresses standing in for two internet hosts. One class, ``gvisor`` (the
default); the rules are CIDRs (the translation is the same for every class,
and the nftables under each are tests/integration/network's)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from podbay.testing.platform import PlatformServer, e2b_key
from podbay.testing.upstream import Upstream, own_subnet, remove_stale_links, upstream

e2b = pytest.importorskip("e2b")

pytestmark = pytest.mark.root

#: gVisor's packets meet the netdev hook, which can only drop: a refusal is
#: a timeout there, a reset under runc.
REFUSED = {"ConnectionRefusedError", "PermissionError", "timeout", "OSError"}
LINK_PREFIX = "pbe2"

#: Runs in the sandbox: connects to argv[2:] on port argv[1] side by side
#: (a dropped packet costs its timeout once), prints {address: outcome}.
PROBE = r"""
import json, socket, sys, threading
port, out = int(sys.argv[1]), {}
def one(address):
    try:
        with socket.create_connection((address, port), timeout=4) as s:
            out[address] = s.recv(100).decode()
    except socket.timeout:
        out[address] = "timeout"
    except OSError as e:
        out[address] = type(e).__name__
threads = [threading.Thread(target=one, args=(a,)) for a in sys.argv[2:]]
[t.start() for t in threads]
[t.join() for t in threads]
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def host(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Upstream]:
    remove_stale_links(LINK_PREFIX)
    workdir = tmp_path_factory.mktemp("upstream")
    link = f"{LINK_PREFIX}{os.getpid()}h"
    with upstream(Path(workdir), link, own_subnet("192.0.2.0")) as found:
        yield found


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, host: Upstream) -> Iterator[PlatformServer]:
    # After the test host: the server's sandboxes learn the host's addresses
    # (its end of the link, refused) when they start.
    env = {"PODBAY_RUNTIME_CLASSES": "gvisor"}
    with PlatformServer.start(tmp_path_factory.mktemp("e2bnet"), env=env) as s:
        deadline = time.monotonic() + 600
        while "gvisor" not in s.http.get("/healthz").json()["classes"]["available"]:
            assert time.monotonic() < deadline, s.http.get("/healthz").text
            time.sleep(0.25)
        yield s


@pytest.fixture(scope="module")
def opts(server: PlatformServer) -> dict[str, Any]:
    key = e2b_key(server, "e2b-net")
    return {"api_key": key, "api_url": server.base_url, "sandbox_url": server.base_url}


def reach(sandbox: Any, host: Upstream) -> dict[str, str]:
    """What a connection from inside the sandbox to each test-host address gets."""
    sandbox.files.write("/tmp/probe.py", PROBE)
    ran = sandbox.commands.run(
        f"python3 /tmp/probe.py {host.port} {' '.join(host.addresses[:2])}", timeout=30
    )
    results: dict[str, str] = json.loads(ran.stdout)
    return results


def test_no_internet_access_reaches_nothing(opts: dict[str, Any], host: Upstream) -> None:
    sandbox = e2b.Sandbox.create(allow_internet_access=False, **opts)
    try:
        results = reach(sandbox, host)
        assert set(results.values()) <= REFUSED, results
        info = sandbox.get_info()
        assert info.allow_internet_access is False
        assert info.network == {"deny_out": [e2b.ALL_TRAFFIC]}
    finally:
        sandbox.kill()


def test_an_allow_list_then_an_update(opts: dict[str, Any], host: Upstream) -> None:
    allowed, other = host.addresses[:2]
    sandbox = e2b.Sandbox.create(
        network={"allow_out": [allowed], "deny_out": [e2b.ALL_TRAFFIC]}, **opts
    )
    try:
        results = reach(sandbox, host)
        assert results[allowed] == host.banner, results
        assert results[other] in REFUSED, results
        info = sandbox.get_info()
        assert info.allow_internet_access is False
        assert info.network == {"allow_out": [f"{allowed}/32"], "deny_out": [e2b.ALL_TRAFFIC]}

        # E2B's allow wins over deny: the allowed address is cut out of the
        # denied range (podbay's deny list is what is left of it), and the
        # other address, the same host, is reached: only the policy differed.
        sandbox.update_network({"deny_out": [host.addresses[0] + "/31"], "allow_out": [other]})
        results = reach(sandbox, host)
        assert results[other] == host.banner, results
        assert results[allowed] in REFUSED, results
        assert sandbox.get_info().network == {"deny_out": [f"{allowed}/32"]}

        sandbox.update_network({})  # every field omitted: cleared, open
        assert set(reach(sandbox, host).values()) == {host.banner}
        info = sandbox.get_info()
        assert (info.allow_internet_access, info.network) == (True, None)
    finally:
        sandbox.kill()


@pytest.mark.parametrize(
    ("body", "status", "code", "words"),
    [
        (
            {"network": {"denyOut": ["example.com"]}},
            400,
            "SANDBOX_NETWORK_ENTRY_INVALID",
            "CIDRs only",
        ),
        ({"network": {"allowOut": ["example.com"]}}, 400, "SANDBOX_NETWORK_INVALID", "ALL_TRAFFIC"),
        (
            {"network": {"allowOut": ["1.1.1.1:443"], "denyOut": ["0.0.0.0/0"]}},
            400,
            "SANDBOX_NETWORK_ENTRY_INVALID",
            "no port",
        ),
        (
            {"network": {"denyOut": ["1.1.1.300"]}},
            400,
            "SANDBOX_NETWORK_ENTRY_INVALID",
            "1.1.1.300",
        ),
        ({"network": {"allowOut": "1.1.1.1"}}, 400, "SANDBOX_NETWORK_INVALID", "list"),
        ({"network": {"blockOut": []}}, 400, "SANDBOX_NETWORK_INVALID", "blockOut"),
        ({"allow_internet_access": "no"}, 400, "SANDBOX_NETWORK_INVALID", "true or false"),
        (
            {"network": {"egressProxy": {"address": "p:1080"}}},
            501,
            "E2B_NOT_IMPLEMENTED",
            "egressProxy",
        ),
    ],
)
def test_refusals_are_e2b_errors(
    server: PlatformServer,
    opts: dict[str, Any],
    body: dict[str, Any],
    status: int,
    code: str,
    words: str,
) -> None:
    headers = {"X-API-Key": opts["api_key"]}
    answer = server.http.post("/v2/sandboxes", headers=headers, json={"templateID": "base", **body})
    assert answer.status_code == status, answer.text
    assert answer.json()["code"] == status
    assert answer.json()["error_code"] == code
    assert words in answer.json()["message"]


def test_the_sdk_raises_a_refusal(opts: dict[str, Any]) -> None:
    with pytest.raises(e2b.SandboxException, match="CIDRs only"):
        e2b.Sandbox.create(network={"deny_out": ["example.com"]}, **opts)
    sandbox = e2b.Sandbox.create(**opts)
    try:
        with pytest.raises(e2b.SandboxException, match="no port"):
            sandbox.update_network({"allow_out": ["1.1.1.1:80"], "deny_out": [e2b.ALL_TRAFFIC]})
        info = sandbox.get_info()
        assert (info.allow_internet_access, info.network) == (True, None)
    finally:
        sandbox.kill()
