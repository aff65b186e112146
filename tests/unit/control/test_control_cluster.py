"""Split roles without processes: placement over enrolled nodes, lost nodes,
leases across replicas, the internal credentials (a real PostgreSQL)."""

from __future__ import annotations

import asyncio
import pathlib
import tempfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from click.testing import CliRunner

from podbay.cli.main import cli
from podbay.control.keys import KeyRing, StoreKeyRing
from podbay.control.plane import ControlPlane, LeaseLocks
from podbay.control.remote import ClusterNodes
from podbay.dataplane import nodeapi
from podbay.dataplane.credentials import CredentialVerifier, mint_credential
from podbay.domain import Sandbox, SandboxState
from podbay.errors import ApiError
from podbay.settings import Settings
from podbay.store.postgres import PostgresStore
from podbay.testing.postgres import TemporaryCluster
from podbay.testing.records import sandbox_record
from podbay.wire.codes import ErrorCode

pytestmark = pytest.mark.anyio
NOW = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.fixture(scope="module")
def postgres() -> Iterator[TemporaryCluster]:
    with TemporaryCluster.start() as cluster:
        yield cluster


@pytest.fixture
async def url(postgres: TemporaryCluster) -> str:
    return postgres.create_database()


@pytest.fixture
async def store(url: str) -> AsyncIterator[PostgresStore]:
    s = PostgresStore.open(url)
    yield s
    await s.close()


def _keys() -> KeyRing:
    return KeyRing.open(pathlib.Path(tempfile.mkdtemp()) / "keys")


def _report(classes: list[str], capacity: int, warm: int = 0) -> dict[str, object]:
    return {
        "ready": True,
        "classes": classes,
        "default": classes[0],
        "capacity": capacity,
        "warm": {c: warm for c in classes},
        "busy": [],
    }


def _sandbox(name: str, node: str) -> Sandbox:
    return sandbox_record(name, state=SandboxState.RUNNING, node=node, at=NOW)


async def test_placement_prefers_warm_then_the_least_loaded(store):
    nodes = ClusterNodes(store, _keys(), lost_after=30, clock=lambda: NOW)
    await store.enroll_node("a", "http://a", "h-a", _report(["container"], 4), NOW)
    await store.enroll_node("b", "http://b", "h-b", _report(["container", "gvisor"], 4), NOW)
    await store.enroll_node("c", "http://c", "h-c", _report(["container"], 1, warm=2), NOW)
    await store.insert_sandbox(_sandbox("full", "c"), deployment_cap=9, account_cap=9)
    await store.insert_sandbox(_sandbox("one", "a"), deployment_cap=9, account_cap=9)
    try:
        # c has warm machines but no room; b is emptier than a.
        assert (await nodes.place("container")).name == "b"
        assert (await nodes.place("gvisor")).name == "b"
        with pytest.raises(ApiError) as refused:
            await nodes.place("vm")
        assert refused.value.code is ErrorCode.SANDBOXES_UNAVAILABLE
        assert nodes.resolve("default") == "container"
        with pytest.raises(ApiError) as unknown:
            nodes.require("vm")
        assert unknown.value.code is ErrorCode.SANDBOX_CLASS_UNAVAILABLE
        # A drained node takes nothing new but still holds what it has.
        await store.drain_node("b")
        await nodes.refresh(force=True)
        assert (await nodes.place("container")).name == "a"
        assert nodes.works("gvisor")
        assert nodes.reachable(_sandbox("x", "b"))
    finally:
        await nodes.close()


async def test_a_silent_node_is_lost_and_its_sandboxes_refused(store):
    now = [NOW]
    nodes = ClusterNodes(store, _keys(), lost_after=30, clock=lambda: now[0])
    await store.enroll_node("a", "http://a", "h-a", _report(["container"], 4), NOW)
    try:
        await nodes.refresh(force=True)
        row = _sandbox("s", "a")
        assert nodes.of(row).endpoint("sb-s") == "http://a/sandbox/sb-s"
        now[0] = NOW + timedelta(seconds=31)
        assert not nodes.reachable(row)
        with pytest.raises(ApiError) as lost:
            nodes.of(row)
        assert lost.value.code is ErrorCode.SANDBOX_NODE_LOST
        assert "'a'" in lost.value.message
        with pytest.raises(ApiError):
            await nodes.place("container")  # no node to place on
        await store.heartbeat_node("a", _report(["container"], 4), now[0])
        await nodes.refresh(force=True)
        assert nodes.reachable(row)  # back: its sandboxes are simply there
        assert not nodes.reachable(_sandbox("t", "forgotten-node"))
    finally:
        await nodes.close()


async def test_a_route_is_trusted_only_while_the_process_that_took_it_reports(store):
    nodes = ClusterNodes(store, _keys(), lost_after=30, clock=lambda: NOW)
    await store.enroll_node(
        "a", "http://a", "h-a", {**_report(["container"], 4), "boot": "b1"}, NOW
    )
    try:
        await nodes.refresh(force=True)
        row = _sandbox("s", "a")
        assert not nodes.of(row).routed(row)  # never published: attach publishes
        assert nodes.of(row).routed(replace(row, routed_on="b1"))
        await store.heartbeat_node("a", {**_report(["container"], 4), "boot": "b2"}, NOW)
        await nodes.refresh(force=True)
        assert not nodes.of(row).routed(replace(row, routed_on="b1"))  # restarted since
    finally:
        await nodes.close()


async def test_one_replica_at_a_time_holds_a_sandbox(url):
    stores = [PostgresStore.open(url), PostgresStore.open(url)]
    locks = [LeaseLocks(s, lambda: datetime.now(UTC)) for s in stores]
    inside: list[int] = []
    overlaps = 0

    async def work(i: int) -> None:
        nonlocal overlaps
        async with locks[i % 2].hold("dep", "name"):
            inside.append(i)
            overlaps = max(overlaps, len(inside))
            await asyncio.sleep(0.01)
            inside.remove(i)

    try:
        await asyncio.gather(*(work(i) for i in range(10)))
        assert overlaps == 1
    finally:
        for s in stores:
            await s.close()


def test_node_calls_and_data_plane_credentials_never_pass_for_each_other():
    keys = _keys()
    call = nodeapi.mint_node_call(keys, "node-a", nodeapi.credential_hash("pbn_a"))
    nodeapi.verify_node_call(keys, call, "node-a", "pbn_a")
    for wrong, node in ((call, "node-b"), (_credential(keys), "node-a")):
        with pytest.raises(ApiError) as refused:
            nodeapi.verify_node_call(keys, wrong, node, "pbn_a")
        assert refused.value.code is ErrorCode.NODE_CREDENTIAL_INVALID
    with pytest.raises(ApiError) as refused:
        CredentialVerifier(keys).verify(call)
    assert refused.value.code is ErrorCode.CREDENTIAL_INVALID


def _credential(keys: KeyRing) -> str:
    token, _ = mint_credential(keys, sandbox_id="sb-1", incarnation=1, ttl_seconds=60)
    return token


def test_control_refuses_to_start_on_sqlite(tmp_path):
    result = CliRunner().invoke(
        cli,
        ["control", "--listen", "127.0.0.1:0", "--data-dir", str(tmp_path)],
        env={"PODBAY_STORE_URL": "", "PODBAY_CLUSTER_ENROLLMENT_TOKEN": "x"},
    )
    assert result.exit_code == 2
    assert "PostgreSQL" in result.output


async def test_shared_keys_start_from_the_data_directorys(store, tmp_path):
    """A serve moving to PostgreSQL keeps its keys, so its tokens stay valid."""
    local = KeyRing.open(tmp_path / "keys")
    token = _credential(local)
    shared = await StoreKeyRing.open(store, adopt=tmp_path / "keys")
    assert shared.kids() == local.kids()
    assert CredentialVerifier(shared).verify(token).sandbox_id == "sb-1"
    rotated = await shared.rotate()
    again = await StoreKeyRing.open(store, adopt=tmp_path / "other")
    assert again.kids() == sorted([*local.kids(), rotated])
    assert again.active().kid == rotated


async def test_a_stopped_sandbox_moves_only_off_a_drained_or_full_node(store):
    nodes = ClusterNodes(store, _keys(), lost_after=30, clock=lambda: NOW)
    movable = {**_report(["container"], 2), "movable": ["container"]}
    await store.enroll_node("a", "http://a", "h-a", movable, NOW)
    await store.enroll_node("b", "http://b", "h-b", movable, NOW)
    await store.enroll_node("c", "http://c", "h-c", _report(["container"], 9), NOW)
    stopped = sandbox_record("s", state=SandboxState.STOPPED, node="a", at=NOW)
    await store.insert_sandbox(stopped, deployment_cap=9, account_cap=9)
    try:
        await nodes.refresh(force=True)
        assert await nodes.relocation(stopped) is None  # a has room: it stays
        await store.insert_sandbox(_sandbox("r1", "a"), deployment_cap=9, account_cap=9)
        await store.insert_sandbox(_sandbox("r2", "a"), deployment_cap=9, account_cap=9)
        # a is full; c has more room but takes no moves: b.
        found = await nodes.relocation(stopped)
        assert found is not None
        assert found[0].name == "b"
        assert "full" in found[1]
        await store.drain_node("b")
        await nodes.refresh(force=True)
        assert await nodes.relocation(stopped) is None  # nowhere to go: it stays
        await store.drain_node("b", drained=False)
        await store.drain_node("a")
        r1 = await store.get_sandbox("dep_d", "r1")
        assert r1 is not None
        assert await store.delete_sandbox(r1)
        await nodes.refresh(force=True)
        found = await nodes.relocation(stopped)
        assert found is not None
        assert found[0].name == "b"
        assert "drained" in found[1]
    finally:
        await nodes.close()


def test_a_disk_pass_opens_one_machine_on_one_node_and_nothing_else():
    keys = _keys()
    token = nodeapi.mint_disk_pass(keys, "node-a", "container", "m-1", "node-b")
    assert nodeapi.verify_disk_pass(keys, token, "node-a", "container", "m-1") == "node-b"
    for holder, machine in (("node-b", "m-1"), ("node-a", "m-2")):
        with pytest.raises(ApiError) as refused:
            nodeapi.verify_disk_pass(keys, token, holder, "container", machine)
        assert refused.value.code is ErrorCode.NODE_CREDENTIAL_INVALID
    call = nodeapi.mint_node_call(keys, "node-a", nodeapi.credential_hash("pbn_a"))
    with pytest.raises(ApiError):
        nodeapi.verify_disk_pass(keys, call, "node-a", "container", "m-1")
    with pytest.raises(ApiError):
        nodeapi.verify_node_call(keys, token, "node-a", "pbn_a")
    with pytest.raises(ApiError):
        CredentialVerifier(keys).verify(token)


@pytest.fixture
async def control(store, tmp_path) -> AsyncIterator[tuple[ControlPlane, httpx.AsyncClient]]:
    """A control plane over the real PostgreSQL, called in process."""
    settings = Settings.load(environ={}, data_dir=tmp_path / "data")
    settings.server.public_url = "http://control.test"
    settings.cluster.enrollment_token = ENROLLMENT
    plane = ControlPlane(settings, store, await StoreKeyRing.open(store))
    transport = httpx.ASGITransport(app=plane)
    async with httpx.AsyncClient(transport=transport, base_url="http://control.test") as client:
        yield plane, client
    for task in list(plane._tasks):  # enrollment's reconcile waits for a node never ready
        task.cancel()
    await asyncio.gather(*plane._tasks, return_exceptions=True)
    await plane.nodes.close()


ENROLLMENT = "enroll-me"


async def _enroll(client: httpx.AsyncClient, name: str, url: str) -> httpx.Response:
    body = {"name": name, "url": url, "token": ENROLLMENT, "report": {"ready": False}}
    return await client.post(nodeapi.ENROLL, json=body)


async def test_enrolling_under_an_enrolled_nodes_name_is_refused_until_it_is_forgotten(control):
    """Whoever holds the enrollment token cannot take an enrolled node's name
    (and with it the node's control calls, sent to their own URL)."""
    plane, client = control
    first = await _enroll(client, "node-a", "http://10.0.0.1:8701")
    assert first.status_code == 200, first.text
    real = first.json()["credential"]
    thief = await _enroll(client, "node-a", "http://10.6.6.6:8701")
    assert thief.status_code == 409
    assert thief.json()["code"] == "NODE_NAME_TAKEN"
    assert "forget" in thief.json()["error"]
    (record,) = await plane.store.list_nodes()
    assert record.url == "http://10.0.0.1:8701"
    assert record.credential_hash == nodeapi.credential_hash(real)
    # Control calls go to the enrolled URL, and the real node takes them.
    await plane.nodes.refresh(force=True)
    node = plane.nodes.get("node-a")
    assert node is not None
    assert node.url == "http://10.0.0.1:8701"
    call = nodeapi.bearer(node._auth()["Authorization"])
    nodeapi.verify_node_call(plane.keys, call, "node-a", real)
    # The operator forgets it: the name is free, and whoever enrolls next gets
    # control calls the forgotten node refuses (they name the new enrollment).
    assert await plane.store.forget_node("node-a")
    again = await _enroll(client, "node-a", "http://10.6.6.6:8701")
    assert again.status_code == 200, again.text
    await plane.nodes.refresh(force=True)
    moved = plane.nodes.get("node-a")
    assert moved is not None
    assert moved.url == "http://10.6.6.6:8701"
    call = nodeapi.bearer(moved._auth()["Authorization"])
    nodeapi.verify_node_call(plane.keys, call, "node-a", again.json()["credential"])
    with pytest.raises(ApiError) as refused:
        nodeapi.verify_node_call(plane.keys, call, "node-a", real)
    assert refused.value.code is ErrorCode.NODE_CREDENTIAL_INVALID
    with pytest.raises(ApiError):  # a node not enrolled takes no call at all
        nodeapi.verify_node_call(plane.keys, call, "node-a", None)


async def test_the_cluster_endpoints_refuse_deep_json_with_400(control):
    """100,000 nested arrays: a refusal with a code, not a RecursionError's 500."""
    _, client = control
    credential = (await _enroll(client, "node-d", "http://10.0.0.4:8701")).json()["credential"]
    deep = b"[" * 100_000 + b"]" * 100_000
    for path in (nodeapi.ENROLL, nodeapi.HEARTBEAT, nodeapi.SUSPECTS):
        r = await client.post(path, content=deep, headers={"Authorization": f"Bearer {credential}"})
        assert r.status_code == 400, r.text
        assert r.json()["code"] == "REQUEST_INVALID"
        assert "deeply" in r.json()["error"]


async def test_a_nodes_internal_bodies_refuse_deep_json_with_400():
    """The node's side of the internal API reads its bodies the same way."""
    from starlette.requests import Request

    from podbay.node.control_calls import _body

    deep = b"[" * 100_000 + b"]" * 100_000

    async def receive() -> dict[str, object]:
        return {"type": "http.request", "body": deep, "more_body": False}

    request = Request({"type": "http", "method": "POST", "path": "/", "headers": []}, receive)
    with pytest.raises(ApiError) as refused:
        await _body(request)
    assert refused.value.code is ErrorCode.REQUEST_INVALID
    assert "deeply" in refused.value.message
