"""Fork in a cluster (docs/fork.md): the control replica orders the node that
holds the source (``POST /internal/v1/machines/{class}/{machine}/fork``), the
copies run on that node. Leaves no sandbox behind (test_cluster_moves.py
counts them)."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator

import pytest

from podbay.client import NetworkPolicy, SandboxClient
from podbay.errors import SandboxRequestError
from podbay.testing.local_cluster import LocalCluster

pytestmark = pytest.mark.root


@pytest.fixture(scope="module")
def token(cluster: LocalCluster) -> str:
    return cluster.create_deployment("cluster-fork-agent")


@pytest.fixture
def client(cluster: LocalCluster, token: str) -> Iterator[SandboxClient]:
    with SandboxClient(identity_token=token, server_url=cluster.url) as c:
        yield c


def test_a_fork_runs_on_the_sources_node_with_its_files_and_policy(
    cluster: LocalCluster, client: SandboxClient
) -> None:
    source = f"c-fork-{uuid.uuid4().hex[:8]}"
    copies = [f"{source}-a", f"{source}-b"]
    handle = client.attach(source, network=NetworkPolicy(deny=["192.0.2.0/24"]))
    try:
        client.write_file(source, "/root/note", "from the source")
        result = client.fork(source, *copies)
        assert [h.name for h in result.sandboxes] == copies
        for forked in result.sandboxes:
            assert cluster.node_for(forked.endpoint) is cluster.node_for(handle.endpoint)
        for copy in copies:
            assert client.read_file(copy, "/root/note") == "from the source"
            assert client.network(copy).deny == ["192.0.2.0/24"]
        client.write_file(copies[0], "/root/note", "changed in a copy")
        assert client.read_file(source, "/root/note") == "from the source"
        with pytest.raises(SandboxRequestError) as taken:
            client.fork(source, copies[1])
        assert taken.value.code == "SANDBOX_NAME_TAKEN"
    finally:
        for name in [source, *copies]:
            with contextlib.suppress(SandboxRequestError):
                client.delete(name)
