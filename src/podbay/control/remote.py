"""The nodes of a cluster as the control plane sees them: :class:`RemoteNode`
(one node's internal API over HTTP) and :class:`ClusterNodes` (every
enrolled node: placement, lost nodes, classes across them).

What a replica knows of the nodes is the store's ``nodes`` table, re-read at
most once a second (placement, each attach) and on every lifecycle pass, so
replicas agree without talking to each other. A node is *lost* when its last
heartbeat is older than ``cluster.node_lost_seconds``; its sandboxes are then
reported ``lost`` and attach refuses them with ``SANDBOX_NODE_LOST`` (never
recreated elsewhere while the node might come back) until an operator drains
or forgets the node.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any
from urllib.parse import urlencode

import httpx

from podbay.dataplane import nodeapi
from podbay.dataplane.activity import keep_newest
from podbay.dataplane.classes import refuse_unknown_class
from podbay.dataplane.environment_seam import Building, Prepared
from podbay.dataplane.oom import OomTally
from podbay.dataplane.orders import Launch, Transfer
from podbay.domain import Deployment, Sandbox
from podbay.domain.egress import EgressDestination, EgressPolicy
from podbay.domain.node import NodeRecord
from podbay.errors import ApiError
from podbay.runtime.base import ForkCopy, MachineState, ObservedMachine
from podbay.runtime.classes import CLASSES
from podbay.runtime.transfer import Received
from podbay.signing import SigningKeys
from podbay.store.postgres import PostgresStore
from podbay.wire import codec
from podbay.wire.codes import ErrorCode
from podbay.wire.limits import DEFAULT_SANDBOX_CLASS
from podbay.wire.observe import CommandEntry, MetricSample
from podbay.wire.paths import SHARE_PREFIX

from .nodes import Node

log = logging.getLogger("podbay.cluster")
SANDBOX_PATH = "/sandbox/"
CALL_TIMEOUT = httpx.Timeout(60.0, connect=5.0)


def _raise_for(r: httpx.Response) -> None:
    if r.status_code < 400:
        return
    try:
        doc = r.json()
        code = ErrorCode(doc["code"])
        message = str(doc["error"])
    except (ValueError, KeyError, TypeError):  # not JSON, not an object, or an unknown code
        code, message = ErrorCode.INTERNAL, f"the node answered {r.status_code}"
    if code is ErrorCode.NODE_CREDENTIAL_INVALID:
        # The node does not take our calls: that is ours to fix, not the caller's.
        code, message = ErrorCode.INTERNAL, f"the node refused the control plane: {message}"
    retry = r.headers.get("retry-after")
    # A temporary refusal (a node starting) stays one for the client.
    raise ApiError(code, message, retry_after=float(retry) if retry and retry.isdigit() else None)


class RemoteNode:
    """One node's internal API; the :class:`~podbay.control.nodes.Node` interface."""

    marks_routes = True

    def __init__(self, record: NodeRecord, client: httpx.AsyncClient, keys: SigningKeys) -> None:
        self.record = record
        self.name = record.name
        self.url = record.url.rstrip("/")
        self.client = client
        self.keys = keys
        #: The token, when it was minted and for which enrollment of the node.
        self._token: tuple[str, float, str] | None = None
        #: Attaches seen here, flushed with the lifecycle pass.
        self._touched: dict[str, datetime] = {}
        self._oom_tally = OomTally()

    def _auth(self) -> dict[str, str]:
        now = time.monotonic()
        enrollment = self.record.credential_hash
        if (
            self._token is None
            or now - self._token[1] > nodeapi.NODE_CALL_SECONDS / 2
            or self._token[2] != enrollment
        ):
            token = nodeapi.mint_node_call(self.keys, self.name, enrollment)
            self._token = (token, now, enrollment)
        return {"Authorization": f"Bearer {self._token[0]}"}

    async def _call(
        self, method: str, path: str, body: Any = None, *, limit: httpx.Timeout = CALL_TIMEOUT
    ) -> Any:
        try:
            r = await self.client.request(
                method,
                f"{self.url}{nodeapi.PREFIX}{path}",
                json=body,
                headers=self._auth(),
                timeout=limit,
            )
        except httpx.TransportError as exc:
            if method != "GET":
                raise ApiError(
                    ErrorCode.SANDBOX_START_FAILED, f"node {self.name} did not answer: {exc}"
                ) from None
            # A look at a node that is restarting or being lost is worth asking again
            # shortly; it is not a fault of ours to report as a 500.
            raise ApiError(
                ErrorCode.SANDBOXES_UNAVAILABLE,
                f"node {self.name} did not answer: {exc}",
                retry_after=1.0,
            ) from None
        _raise_for(r)
        return r.json() if r.content else None

    def endpoint(self, sandbox_id: str) -> str:
        return f"{self.url}{SANDBOX_PATH}{sandbox_id}"

    def share_base(self) -> str:
        return f"{self.url}{SHARE_PREFIX}"

    # -- capacity ----------------------------------------------------------------------
    async def shortfall(self) -> str | None:
        return None  # the node refuses with HOST_DISK_FULL itself when it launches

    def can_suspend(self, class_: str) -> bool:
        return True  # every class suspends; a node that cannot stops instead

    def can_fork(self, class_: str) -> bool:
        return True  # the node refuses a class whose driver cannot (SANDBOX_FORK_UNSUPPORTED)

    # -- machines ------------------------------------------------------------------------
    async def prepare(self, deployment: Deployment, class_: str) -> Prepared | Building:
        doc = await self._call(
            "POST", "/prepare", {"deployment": nodeapi.deployment_doc(deployment), "class": class_}
        )
        if "building" in doc:
            return Building(int(doc["building"]))
        return Prepared(key=str(doc["key"]))

    async def take_warm(self, class_: str, prepared: Prepared) -> str | None:
        doc = await self._call("POST", "/warm/take", {"class": class_, "key": prepared.key})
        machine = doc.get("machine_id")
        return machine if isinstance(machine, str) else None

    async def give_back(self, class_: str, prepared: Prepared, machine_id: str) -> None:
        await self._call(
            "POST",
            "/warm/give-back",
            {"class": class_, "key": prepared.key, "machine_id": machine_id},
        )

    async def launch(self, order: Launch, prepared: Prepared, deployment: Deployment) -> None:
        await self._call(
            "POST",
            "/launch",
            {
                "class": order.class_,
                "machine_id": order.machine_id,
                "hostname": order.hostname,
                "labels": dict(order.labels),
                "pooled": order.pooled,
                "env": dict(order.env),
                "cpus": order.cpus,
                "memory_bytes": order.memory_bytes,
                "egress": order.egress.to_doc(),
                "key": prepared.key,
                "deployment": nodeapi.deployment_doc(deployment),
            },
        )

    async def _act(self, action: str, class_: str, machine_id: str) -> None:
        await self._call("POST", f"/machines/{class_}/{machine_id}/{action}")

    async def start(self, class_: str, machine_id: str) -> None:
        await self._act("start", class_, machine_id)

    async def suspend(self, class_: str, machine_id: str) -> None:
        await self._act("suspend", class_, machine_id)

    async def resume(self, class_: str, machine_id: str) -> None:
        await self._act("resume", class_, machine_id)

    async def stop(self, class_: str, machine_id: str) -> None:
        await self._act("stop", class_, machine_id)

    async def destroy(self, class_: str, machine_id: str) -> None:
        await self._act("destroy", class_, machine_id)

    async def fork(self, class_: str, source_id: str, copies: list[ForkCopy]) -> float:
        doc = await self._call(
            "POST",
            f"/machines/{class_}/{source_id}/fork",
            {
                "copies": [
                    {"machine_id": c.machine_id, "hostname": c.hostname, "labels": dict(c.labels)}
                    for c in copies
                ]
            },
            limit=httpx.Timeout(None, connect=5.0),
        )
        return float(doc["held_seconds"])

    async def set_egress(self, class_: str, machine_id: str, egress: EgressPolicy) -> None:
        await self._call("PUT", f"/machines/{class_}/{machine_id}/egress", egress.to_doc())

    async def egress_audit(self, class_: str, machine_id: str) -> list[EgressDestination]:
        doc = await self._call("GET", f"/machines/{class_}/{machine_id}/egress")
        return [EgressDestination.from_doc(d) for d in doc["destinations"]]

    async def state(self, class_: str, machine_id: str) -> MachineState:
        doc = await self._call("GET", f"/machines/{class_}/{machine_id}")
        return MachineState(doc["state"])

    async def adopt(self) -> dict[str, list[ObservedMachine]]:
        doc = await self._call("GET", "/machines")
        return {
            name: [
                ObservedMachine(
                    machine_id=m["machine_id"],
                    state=MachineState(m["state"]),
                    labels=m.get("labels", {}),
                )
                for m in seen
            ]
            for name, seen in doc.items()
        }

    async def receive(self, transfer: Transfer, prepared: Prepared) -> Received:
        # The bytes go node to node; this call waits for the whole transfer.
        doc = await self._call(
            "POST",
            "/moves/receive",
            {
                "class": transfer.class_,
                "machine_id": transfer.machine_id,
                "source_url": transfer.source_url,
                "token": transfer.token,
                "env": dict(transfer.env),
                "key": prepared.key,
            },
            limit=httpx.Timeout(None, connect=5.0),
        )
        return Received(
            bytes=int(doc["bytes"]), sha256=str(doc["sha256"]), sent_sha256=str(doc["sent_sha256"])
        )

    # -- routes --------------------------------------------------------------------------
    async def publish(self, sandbox: Sandbox) -> str | None:
        doc = await self._call(
            "PUT",
            f"/routes/{sandbox.id}",
            {
                "class": sandbox.class_,
                "machine_id": sandbox.machine_id,
                "incarnation": sandbox.incarnation,
            },
        )
        boot = doc.get("boot") if isinstance(doc, dict) else None
        return boot if isinstance(boot, str) and boot else None

    async def withdraw(self, sandbox_id: str) -> None:
        await self._call("DELETE", f"/routes/{sandbox_id}")

    def routed(self, sandbox: Sandbox) -> bool:
        # The node's routes live in its memory: the process that took this one
        # (the row's routed_on) must be the one reporting now (the boot of its
        # last heartbeat). A restart changes the boot, so its lost routes are
        # published again; a withdrawal clears routed_on first.
        boot = self.record.report.get("boot")
        return sandbox.routed_on is not None and sandbox.routed_on == boot

    # -- observation ---------------------------------------------------------------------
    async def metrics(self, sandbox_id: str, since: datetime | None) -> list[MetricSample]:
        query = "" if since is None else "?" + urlencode({"since": codec.format_time(since)})
        doc = await self._call("GET", f"/metrics/{sandbox_id}{query}")
        return [codec.decode(MetricSample, d, strict=False) for d in doc or []]

    async def latest_metrics(self) -> dict[str, MetricSample]:
        doc = await self._call("GET", "/metrics")
        if not isinstance(doc, dict):
            return {}
        return {
            str(sandbox_id): codec.decode(MetricSample, sample, strict=False)
            for sandbox_id, sample in doc.items()
        }

    async def new_oom_kills(self) -> dict[str, tuple[datetime, int]]:
        # The node's running totals arrive with its heartbeats.
        totals: dict[str, tuple[datetime, int]] = {}
        for sandbox_id, seen in dict(self.record.report.get("oom", {})).items():
            try:
                totals[str(sandbox_id)] = (codec.parse_time(seen[0]), int(seen[1]))
            except (ValueError, TypeError, IndexError, OverflowError):
                continue  # a node of another version: nothing to say
        return self._oom_tally.new(totals)

    async def commands(self, sandbox: Sandbox) -> list[CommandEntry]:
        query = urlencode(
            {
                "class": sandbox.class_,
                "machine": sandbox.machine_id,
                "incarnation": sandbox.incarnation,
            }
        )
        doc = await self._call("GET", f"/commands/{sandbox.id}?{query}")
        return [codec.decode(CommandEntry, d, strict=False) for d in doc or []]

    # -- activity (data-plane activity arrives with the node's heartbeats) ----------------
    def touch(self, sandbox_id: str) -> None:
        self._touched[sandbox_id] = datetime.now(self.record.heartbeat_at.tzinfo)

    def last_seen(self, sandbox_id: str) -> datetime | None:
        return self._touched.get(sandbox_id)

    def busy(self, sandbox_id: str) -> bool:
        return sandbox_id in set(self.record.report.get("busy", []))

    async def drain_activity(self) -> dict[str, datetime]:
        seen, self._touched = self._touched, {}
        return seen

    def restore_activity(self, seen: Mapping[str, datetime]) -> None:
        keep_newest(self._touched, seen)


class ClusterNodes:
    """Every enrolled node, from the store; the :class:`~podbay.control.nodes.Nodes` set."""

    STALE_SECONDS = 1.0

    # Takes its collaborators in and keeps them by name, as every service and
    # the gateway do: alike in shape by nature (explicit wiring), nothing shared.
    def __init__(
        self,
        store: PostgresStore,
        keys: SigningKeys,
        *,
        lost_after: float,
        clock: Callable[[], datetime],
    ) -> None:
        self.store = store
        self.keys = keys
        self.lost_after = lost_after
        self.clock = clock
        # No kept connections: after a node restarts, a pooled connection to its
        # old process fails on its next use ("did not answer", an empty read
        # error), which made attach fail right after a node restart. Control
        # calls a node per lifecycle step, never per command, so a new loopback
        # or LAN connection per call costs nothing that shows.
        self.client = httpx.AsyncClient(
            timeout=CALL_TIMEOUT, limits=httpx.Limits(max_keepalive_connections=0)
        )
        self._nodes: dict[str, RemoteNode] = {}
        self._read_at = 0.0

    async def refresh(self, *, force: bool = False) -> None:
        """Read the nodes again if the view is older than :attr:`STALE_SECONDS`,
        or (``force``) at once. A view in which no node runs any class yet is
        read again every time: nodes that enrolled and are starting become
        ready any moment, and a request should not be refused (:meth:`require`,
        :meth:`resolve`) on a look taken just before."""
        fresh = time.monotonic() - self._read_at < self.STALE_SECONDS
        if not force and fresh and self._classes(drained=True):
            return
        records = await self.store.list_nodes()
        nodes: dict[str, RemoteNode] = {}
        for record in records:
            node = self._nodes.get(record.name)
            if node is None or node.url != record.url.rstrip("/"):
                node = RemoteNode(record, self.client, self.keys)
            node.record = record
            nodes[record.name] = node
        self._nodes = nodes
        self._read_at = time.monotonic()

    def get(self, name: str) -> RemoteNode | None:
        return self._nodes.get(name)

    def records(self) -> list[NodeRecord]:
        return [n.record for n in self._nodes.values()]

    def lost(self, record: NodeRecord) -> bool:
        return record.lost(self.clock(), self.lost_after)

    # -- Nodes ---------------------------------------------------------------------------
    def reachable(self, sandbox: Sandbox) -> bool:
        node = self._nodes.get(sandbox.node)
        return node is not None and not self.lost(node.record)

    def of(self, sandbox: Sandbox) -> RemoteNode:
        node = self._nodes.get(sandbox.node)
        if node is None or self.lost(node.record):
            raise ApiError(
                ErrorCode.SANDBOX_NODE_LOST,
                f"sandbox {sandbox.name!r} is on node {sandbox.node!r}, which stopped "
                "answering; it is not recreated elsewhere while that node may come back "
                "(an operator can `podbay node drain` or `forget` it)",
            )
        return node

    def all(self) -> list[Node]:
        return list(self._nodes.values())

    def _usable(self) -> list[RemoteNode]:
        return [
            n
            for n in self._nodes.values()
            if not n.record.drained and not self.lost(n.record) and n.record.report.get("ready")
        ]

    async def place(
        self, class_: str, *, movable: bool = False, besides: str | None = None
    ) -> RemoteNode:
        """A node for a new sandbox of ``class_`` (``movable``: one that takes
        machines of it from other nodes; ``besides``: not that node)."""
        await self.refresh()
        held = Counter(await self.store.held_by_node())
        candidates = []
        for node in self._usable():
            report = node.record.report
            if class_ not in report.get("classes", []) or node.name == besides:
                continue
            if movable and class_ not in report.get("movable", []):
                continue
            room = int(report.get("capacity", 0)) - held[node.name]
            if room <= 0:
                continue
            warm = int(report.get("warm", {}).get(class_, 0))
            # Warm machines first (no boot), then the emptiest node.
            candidates.append((warm <= 0, held[node.name] / max(1, room + held[node.name]), node))
        if not candidates:
            raise ApiError(
                ErrorCode.SANDBOXES_UNAVAILABLE,
                f"no node has room for a sandbox of class {class_!r} now",
                retry_after=2,
            )
        candidates.sort(key=lambda c: (c[0], c[1]))
        return candidates[0][2]

    async def relocation(self, sandbox: Sandbox) -> tuple[Node, str] | None:
        await self.refresh()
        source = self._nodes.get(sandbox.node)
        if (
            source is None
            or self.lost(source.record)  # its disk cannot be read now
            or sandbox.class_ not in source.record.report.get("movable", [])
        ):
            return None
        if source.record.drained:
            why = f"node {source.name} is drained"
        else:
            held = (await self.store.held_by_node()).get(source.name, 0)
            if held < int(source.record.report.get("capacity", 0)):
                return None  # it stays where its files are
            why = f"node {source.name} is full"
        try:
            return await self.place(sandbox.class_, movable=True, besides=source.name), why
        except ApiError:
            return None  # nowhere else to go: it carries over where it is

    def transfer(self, source: Node, target: Node, class_: str, machine_id: str) -> Transfer:
        assert isinstance(source, RemoteNode)
        token = nodeapi.mint_disk_pass(self.keys, source.name, class_, machine_id, target.name)
        return Transfer(class_, machine_id, source.url, token)

    def _classes(self, *, drained: bool = False) -> list[str]:
        nodes = (
            [n for n in self._nodes.values() if not self.lost(n.record)]
            if drained
            else self._usable()
        )
        running = {c for n in nodes for c in n.record.report.get("classes", [])}
        return [c for c in CLASSES if c in running]

    def resolve(self, requested: str) -> str:
        refuse_unknown_class(requested)
        if requested != DEFAULT_SANDBOX_CLASS:
            return self.require(requested)
        defaults = Counter(
            n.record.report.get("default") for n in self._usable() if n.record.report.get("default")
        )
        if not defaults:
            raise ApiError(
                ErrorCode.SANDBOXES_UNAVAILABLE,
                "no node is ready to run sandboxes now",
                retry_after=2,
            )
        return str(defaults.most_common(1)[0][0])

    def require(self, class_: str) -> str:
        running = self._classes(drained=True)
        if class_ in running:
            return class_
        if not running:
            # Nothing runs anywhere yet (no node enrolled, or the nodes are still
            # starting or all lost): a state that passes, not a class refused.
            why = (
                "no node is ready to run sandboxes now"
                if self._nodes
                else "no node is enrolled yet"
            )
            raise ApiError(ErrorCode.SANDBOXES_UNAVAILABLE, why, retry_after=2)
        raise ApiError(
            ErrorCode.SANDBOX_CLASS_UNAVAILABLE,
            f"sandbox class {class_!r} is not available on any node; they can run: "
            f"{', '.join(running) or 'none'}",
        )

    def works(self, class_: str) -> bool:
        """Some node that is not lost runs it (drained ones too: their
        sandboxes still live there)."""
        return class_ in self._classes(drained=True)

    async def close(self) -> None:
        await self.client.aclose()


def node_keys_doc(keys: Any) -> dict[str, Any]:
    """The public half of every signing key, for nodes."""
    return {
        "keys": [
            {"kid": kid, "public": nodeapi.public_key_text(keys.public_key(kid))}
            for kid in keys.kids()
            if keys.public_key(kid) is not None
        ]
    }
