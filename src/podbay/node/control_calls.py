"""A node's internal API (``/internal/v1``): the control plane's calls, each
carrying a control-call token signed for this node (:mod:`podbay.dataplane.nodeapi`).

Each route is one :class:`~podbay.control.nodes.Node` method of the node's
:class:`~podbay.node.local.LocalNode`; refusals travel as the contract's
``{"error", "code"}`` and are raised again on the control plane's side.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any, Protocol

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from podbay.dataplane import nodeapi
from podbay.dataplane.classes import ClassRuntimes
from podbay.dataplane.environment_seam import Building, Prepared
from podbay.dataplane.orders import Launch, Transfer
from podbay.domain import Sandbox, SandboxState
from podbay.domain.egress import EgressPolicy
from podbay.errors import ApiError
from podbay.runtime.base import ForkCopy, MachineState, check_machine_id
from podbay.signing import VerifyingKeys
from podbay.wire import codec
from podbay.wire.codes import ErrorCode
from podbay.wire.limits import MAX_FORK_COPIES

from .local import LocalNode

P = nodeapi.PREFIX
log = logging.getLogger("podbay.node")
MACHINE_ACTIONS = ("start", "suspend", "resume", "stop", "destroy")


class NodeServer(Protocol):
    """What these routes read of the node that serves them (``app.state.node``):
    the server holding them names this module, not the other way round."""

    name: str
    keys: VerifyingKeys
    #: The node credential enrollment gave this node (None: not enrolled).
    credential: str | None
    ready: bool
    classes: ClassRuntimes
    #: Environments this node prepared, by key.
    prepared: dict[str, Prepared]
    node: LocalNode
    #: Changes at every start of the node process.
    boot: str


def _invalid(what: str) -> ApiError:
    return ApiError(ErrorCode.REQUEST_INVALID, what)


async def _authorized(request: Request) -> NodeServer:
    node: NodeServer = request.app.state.node
    nodeapi.verify_node_call(
        node.keys, nodeapi.bearer(request.headers.get("authorization")), node.name, node.credential
    )
    return node


async def _body(request: Request) -> dict[str, Any]:
    try:
        return codec.parse_object(await request.body())
    except codec.WireError as exc:
        raise _invalid(str(exc)) from None


def _str(doc: dict[str, Any], key: str) -> str:
    value = doc.get(key)
    if not isinstance(value, str):
        raise _invalid(f"{key} must be a string")
    return value


def _machine(value: str) -> str:
    try:
        return check_machine_id(value)
    except ValueError:
        raise _invalid("invalid machine id") from None


def _class(node: NodeServer, value: str) -> str:
    if not node.ready:
        # Starting (its classes being proved): temporary, unlike a class it lacks.
        raise ApiError(
            ErrorCode.SANDBOXES_UNAVAILABLE,
            f"node {node.name} is starting; try again shortly",
            retry_after=1,
        )
    return node.classes.require(value)


def _prepared(node: NodeServer, key: str) -> Prepared:
    prepared = node.prepared.get(key)
    if prepared is None:
        raise _invalid("unknown environment key; prepare first")
    return prepared


async def prepare(request: Request) -> Response:
    node = await _authorized(request)
    doc = await _body(request)
    deployment = nodeapi.deployment_from(doc.get("deployment"))
    result = await node.node.prepare(deployment, _class(node, _str(doc, "class")))
    if isinstance(result, Building):
        return JSONResponse({"building": result.retry_after_seconds})
    node.prepared[result.key] = result
    return JSONResponse({"key": result.key})


async def take_warm(request: Request) -> Response:
    node = await _authorized(request)
    doc = await _body(request)
    prepared = node.prepared.get(_str(doc, "key"))
    if prepared is None:
        return JSONResponse({"machine_id": None})
    machine = await node.node.take_warm(_class(node, _str(doc, "class")), prepared)
    return JSONResponse({"machine_id": machine})


async def give_back(request: Request) -> Response:
    node = await _authorized(request)
    doc = await _body(request)
    prepared = _prepared(node, _str(doc, "key"))
    await node.node.give_back(
        _class(node, _str(doc, "class")), prepared, _machine(_str(doc, "machine_id"))
    )
    return Response(status_code=204)


def _strings(doc: dict[str, Any], key: str) -> dict[str, str]:
    """``doc[key]``, a mapping of strings to strings (absent: empty)."""
    value = doc.get(key) or {}
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise _invalid(f"{key} must map strings to strings")
    return value


async def launch(request: Request) -> Response:
    node = await _authorized(request)
    doc = await _body(request)
    labels = _strings(doc, "labels")
    cpus, memory = doc.get("cpus"), doc.get("memory_bytes")
    if cpus is not None and (isinstance(cpus, bool) or not isinstance(cpus, int | float)):
        raise _invalid("cpus must be a number")
    if memory is not None and (isinstance(memory, bool) or not isinstance(memory, int)):
        raise _invalid("memory_bytes must be an integer")
    order = Launch(
        class_=_class(node, _str(doc, "class")),
        machine_id=_machine(_str(doc, "machine_id")),
        hostname=_str(doc, "hostname"),
        labels=labels,
        pooled=bool(doc.get("pooled")),
        env=_strings(doc, "env"),
        cpus=None if cpus is None else float(cpus),
        memory_bytes=memory,
        # Checked again: a node takes no rule it cannot read as a policy.
        egress=EgressPolicy.parse(doc.get("egress") or {}),
    )
    deployment = nodeapi.deployment_from(doc.get("deployment"))
    await node.node.launch(order, _prepared(node, _str(doc, "key")), deployment)
    return Response(status_code=204)


async def machine_action(request: Request) -> Response:
    node = await _authorized(request)
    class_ = _class(node, request.path_params["class_"])
    machine = _machine(request.path_params["machine"])
    action = request.path_params["action"]
    if action not in MACHINE_ACTIONS:
        raise ApiError(ErrorCode.ROUTE_NOT_FOUND, "no such machine action")
    await getattr(node.node, action)(class_, machine)
    return Response(status_code=204)


async def machine_egress(request: Request) -> Response:
    node = await _authorized(request)
    class_ = _class(node, request.path_params["class_"])
    machine = _machine(request.path_params["machine"])
    egress = EgressPolicy.parse(await _body(request))
    await node.node.set_egress(class_, machine, egress)
    return Response(status_code=204)


async def machine_fork(request: Request) -> Response:
    """Copy a machine into new ones here (a sandbox's fork); the body's
    ``copies``: each new machine's id, hostname and labels."""
    node = await _authorized(request)
    class_ = _class(node, request.path_params["class_"])
    machine = _machine(request.path_params["machine"])
    listed = (await _body(request)).get("copies")
    if not isinstance(listed, list) or not listed or len(listed) > MAX_FORK_COPIES:
        raise _invalid(f"copies must list 1 to {MAX_FORK_COPIES} machines")
    copies = []
    for doc in listed:
        if not isinstance(doc, dict):
            raise _invalid("each copy must be an object")
        copies.append(
            ForkCopy(
                machine_id=_machine(_str(doc, "machine_id")),
                hostname=_str(doc, "hostname"),
                labels=_strings(doc, "labels"),
            )
        )
    held = await node.node.fork(class_, machine, copies)
    return JSONResponse({"held_seconds": held})


async def machine_egress_audit(request: Request) -> Response:
    node = await _authorized(request)
    class_ = _class(node, request.path_params["class_"])
    machine = _machine(request.path_params["machine"])
    rows = await node.node.egress_audit(class_, machine)
    return JSONResponse({"destinations": [row.to_doc() for row in rows]})


async def machine_state(request: Request) -> Response:
    node = await _authorized(request)
    class_ = _class(node, request.path_params["class_"])
    state = await node.node.state(class_, _machine(request.path_params["machine"]))
    return JSONResponse({"state": state.value})


async def machines(request: Request) -> Response:
    node = await _authorized(request)
    observed = await node.node.adopt()
    return JSONResponse(
        {
            name: [
                {"machine_id": m.machine_id, "state": m.state.value, "labels": dict(m.labels)}
                for m in seen
            ]
            for name, seen in observed.items()
        }
    )


async def publish(request: Request) -> Response:
    node = await _authorized(request)
    doc = await _body(request)
    incarnation = doc.get("incarnation")
    if not isinstance(incarnation, int) or isinstance(incarnation, bool):
        raise _invalid("incarnation must be an integer")
    epoch = datetime.now(UTC)
    sandbox = Sandbox(
        id=request.path_params["sandbox"],
        deployment_id="",
        account="",
        name="",
        class_=_class(node, _str(doc, "class")),
        state=SandboxState.RUNNING,
        machine_id=_machine(_str(doc, "machine_id")),
        created_at=epoch,
        last_active_at=epoch,
        started_at=None,
        ceiling_at=None,
        incarnation=incarnation,
        node=node.name,
    )
    await node.node.publish(sandbox)
    # Which process took the route: the control plane records it and attaches
    # without calling again until this node's reported boot changes.
    return JSONResponse({"boot": node.boot})


async def withdraw(request: Request) -> Response:
    node = await _authorized(request)
    await node.node.withdraw(request.path_params["sandbox"])
    return Response(status_code=204)


async def metrics(request: Request) -> Response:
    """The sandbox's metrics samples this node keeps (``?since=`` RFC 3339)."""
    node = await _authorized(request)
    raw = request.query_params.get("since")
    try:
        since = None if raw is None else codec.parse_time(raw)
    except (ValueError, OverflowError):
        raise _invalid("since must be an RFC 3339 time") from None
    samples = await node.node.metrics(request.path_params["sandbox"], since)
    return Response(codec.dumps(samples), media_type="application/json")


async def latest_metrics(request: Request) -> Response:
    """The newest sample of every sandbox this node samples now, by id."""
    node = await _authorized(request)
    return Response(codec.dumps(await node.node.latest_metrics()), media_type="application/json")


async def commands(request: Request) -> Response:
    """The sandbox's command log (``?class=&machine=&incarnation=``)."""
    node = await _authorized(request)
    q = request.query_params
    raw = q.get("incarnation", "")
    if not raw.isdigit() or len(raw) > 18:
        raise _invalid("incarnation must be a whole number")
    found = await node.node.commands_of(
        request.path_params["sandbox"],
        _class(node, q.get("class", "")),
        _machine(q.get("machine", "")),
        int(raw),
    )
    return Response(codec.dumps(found), media_type="application/json")


async def receive(request: Request) -> Response:
    """Fetch a stopped machine's disk from the node named in the body (with the
    disk pass the control plane gave) and make the machine here."""
    node = await _authorized(request)
    doc = await _body(request)
    source_url = _str(doc, "source_url")
    if not source_url.startswith(("http://", "https://")):
        raise _invalid("source_url must be an http(s) URL")
    transfer = Transfer(
        class_=_class(node, _str(doc, "class")),
        machine_id=_machine(_str(doc, "machine_id")),
        source_url=source_url,
        token=_str(doc, "token"),
        env=_strings(doc, "env"),
    )
    received = await node.node.receive(transfer, _prepared(node, _str(doc, "key")))
    return JSONResponse(
        {"bytes": received.bytes, "sha256": received.sha256, "sent_sha256": received.sent_sha256}
    )


async def disk(request: Request) -> Response:
    """A stopped machine's disk (:mod:`podbay.runtime.transfer`), to the node a
    disk pass names: the only call here made by another node."""
    node: NodeServer = request.app.state.node
    class_ = _class(node, request.path_params["class_"])
    machine = _machine(request.path_params["machine"])
    to = nodeapi.verify_disk_pass(
        node.keys, nodeapi.bearer(request.headers.get("authorization")), node.name, class_, machine
    )
    driver = node.node.movable(class_)
    state = await node.node.state(class_, machine)
    if state is not MachineState.STOPPED:
        raise _invalid(f"machine {machine} is {state.value}, not stopped")
    stream = driver.export_disk(machine)
    # The first chunk before the answer: a refusal is then a status, not a cut stream.
    first = await anext(stream)

    async def body() -> Any:
        sent = len(first)
        yield first
        try:
            async for chunk in stream:
                sent += len(chunk)
                yield chunk
        finally:
            await stream.aclose()
            log.info("machine %s: %d bytes of its disk sent to node %s", machine, sent, to)

    return StreamingResponse(body(), media_type="application/octet-stream")


routes = [
    Route(f"{P}/prepare", prepare, methods=["POST"]),
    Route(f"{P}/warm/take", take_warm, methods=["POST"]),
    Route(f"{P}/warm/give-back", give_back, methods=["POST"]),
    Route(f"{P}/launch", launch, methods=["POST"]),
    Route(f"{P}/machines", machines, methods=["GET"]),
    Route(f"{P}/machines/{{class_}}/{{machine}}", machine_state, methods=["GET"]),
    Route(f"{P}/machines/{{class_}}/{{machine}}/egress", machine_egress, methods=["PUT"]),
    Route(f"{P}/machines/{{class_}}/{{machine}}/egress", machine_egress_audit, methods=["GET"]),
    Route(f"{P}/machines/{{class_}}/{{machine}}/fork", machine_fork, methods=["POST"]),
    Route(f"{P}/machines/{{class_}}/{{machine}}/{{action}}", machine_action, methods=["POST"]),
    Route(f"{P}/moves/receive", receive, methods=["POST"]),
    Route(f"{nodeapi.DISKS}/{{class_}}/{{machine}}", disk, methods=["GET"]),
    Route(f"{P}/routes/{{sandbox}}", publish, methods=["PUT"]),
    Route(f"{P}/routes/{{sandbox}}", withdraw, methods=["DELETE"]),
    Route(f"{P}/metrics", latest_metrics, methods=["GET"]),
    Route(f"{P}/metrics/{{sandbox}}", metrics, methods=["GET"]),
    Route(f"{P}/commands/{{sandbox}}", commands, methods=["GET"]),
]
