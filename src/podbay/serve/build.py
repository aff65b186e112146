"""The one builder of podbay's servers: ``podbay serve`` (control plane, node
and gateway in one process: :func:`serve_app`), ``podbay control``
(:func:`control_app`) and ``podbay node`` (:func:`node_app`), with what they
share (each class's driver, declared environments, class checks).

The planes import nothing of each other; what one hands another (the node's
gateway, the all-in-one platform's in-process node) is put together here.
Nothing is built at import: the CLI calls these when a command runs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, TypedDict

from podbay.dataplane.classes import ClassCheck, ClassProof
from podbay.dataplane.environment_seam import EnvironmentService, PlainEnvironment
from podbay.runtime import classes
from podbay.runtime.base import Driver, Limits
from podbay.runtime.classes import CONTAINER
from podbay.settings import Settings

# Each role loads only its own planes (a control replica neither the node nor
# the gateway, a node not the control plane): each builder imports its own.
if TYPE_CHECKING:
    from podbay.control.keys import KeyRing, StoreKeyRing
    from podbay.control.plane import ControlPlane
    from podbay.control.services.deployments import SectionValidator
    from podbay.node.server import NodeServer
    from podbay.store.base import Store
    from podbay.store.postgres import PostgresStore

    from .platform import Platform


def serve_app(
    settings: Settings,
    store: Store,
    drivers: Mapping[str, Driver],
    hooks: ClassHooks,
    *,
    keys: KeyRing | StoreKeyRing | None = None,
) -> Platform:
    """``podbay serve``: every plane in this process, the node in process."""
    from .platform import create_app

    return create_app(
        settings, store, drivers, keys=keys, validate_section=section_validator(), **hooks
    )


def control_app(settings: Settings, store: PostgresStore, keys: StoreKeyRing) -> ControlPlane:
    """``podbay control``: one control-plane replica; its nodes are remote."""
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    from podbay.console import admin
    from podbay.console.guard import Guard
    from podbay.console.latest import LatestSamples
    from podbay.console.layer import ConsoleLayer
    from podbay.console.remote import RemoteDataPlane
    from podbay.console.tokens import Generation
    from podbay.control.plane import ControlPlane
    from podbay.e2b import nodes as e2b_nodes
    from podbay.e2b.app import E2BApps

    async def e2b_reach(request: Request) -> Response:
        """A node asks whether an E2B caller reaches a sandbox, and for its attach."""
        await plane.authenticate_node(request)
        return await e2b_nodes.answer_node(e2b.service, await plane.read_json(request))

    plane = ControlPlane(
        settings,
        store,
        keys,
        validate_section=section_validator(),
        extra_routes=[*admin.routes, Route(e2b_nodes.REACH, e2b_reach, methods=["POST"])],
    )
    # The web console (docs/console.md) in front of the API; its data plane is
    # relayed to the nodes. The operator's API finds the guard on the plane.
    guard = Guard(keys, plane.base_url, Generation(store), plane.deployments)
    plane.console_guard = guard
    latest = LatestSamples(plane.sandboxes.nodes)
    plane.wrap(lambda api: ConsoleLayer(api, guard, plane.sandboxes, RemoteDataPlane(), latest))
    # E2B's SDKs (docs/e2b.md) before both; its sandbox traffic enters at the
    # nodes, the data-plane tier, so a replica refuses it.
    e2b = E2BApps(store, plane.sandboxes, Limits.of(settings.runtime), settings.server.e2b_domain)
    plane.wrap(lambda api: e2b.in_front_of(api, sandbox_traffic=e2b_nodes.misdirected()))
    plane.on_start.append(e2b.service.start_sweeper)  # E2B's timeouts hold across restarts
    plane.on_close.append(e2b.service.close)
    return plane


def node_app(settings: Settings, drivers: Mapping[str, Driver], hooks: ClassHooks) -> NodeServer:
    """``podbay node``: this host's machines and the gateway to them."""
    from podbay.e2b.app import E2BApps
    from podbay.e2b.nodes import NodeE2BService
    from podbay.gateway.app import Gateway
    from podbay.node.server import NodeServer

    def e2b_sandbox_api(node: NodeServer) -> E2BApps:
        # E2B's sandbox API (commands, files, ports) enters at the nodes, the
        # data-plane tier; the node asks its control plane who may reach what.
        return E2BApps.sandbox_api(
            NodeE2BService(
                node.control_url, lambda: node.credential, local_gateway=(node.url, node.gateway)
            )
        )

    return NodeServer(settings, drivers, gateway=Gateway, surfaces=[e2b_sandbox_api], **hooks)


class ClassHooks(TypedDict):
    """What a server (``serve``'s app, a node) gets to run its sandbox classes."""

    environment: EnvironmentService
    missing: Mapping[str, str]
    check: ClassCheck
    prove: ClassProof


def class_hooks(
    settings: Settings, drivers: Mapping[str, Driver], missing: Mapping[str, str]
) -> ClassHooks:
    """Declared environments on ``drivers``, why a class has no driver, and how a
    class is checked on this host and proved with a throwaway sandbox."""
    return ClassHooks(
        environment=environment_service(settings, drivers),
        missing=missing,
        check=lambda name, driver: classes.check_class(settings, name, driver),
        prove=lambda name, driver: classes.prove_class(settings, name, driver),
    )


def environment_service(settings: Settings, drivers: Mapping[str, Driver]) -> EnvironmentService:
    """Declared environments: layers built once, cached in ``<data_dir>/layers``.

    A layer is built by the ``container`` class's driver whenever it stands on
    the same base image as the class that needs it (runc builds fastest, and
    its files carry the shared uid shift every OCI class reads); otherwise by
    the class's own driver. Classes on one base image share one cache key, so
    a layer is built once for all of them."""
    if not drivers:
        return PlainEnvironment()
    from podbay.environment.build import Environments, LayerBuilder, LayerCache
    from podbay.environment.service import DeclaredEnvironment

    limits = Limits.of(settings.runtime)
    cache = LayerCache(settings.layer_dir)
    builders: dict[int, Environments] = {}  # id of the building driver -> its Environments
    by_class: dict[str, Environments] = {}
    for name, driver in drivers.items():
        container = drivers.get(CONTAINER)
        builder = (
            container
            if container is not None and container.base_image == driver.base_image
            else driver
        )
        if id(builder) not in builders:
            builders[id(builder)] = Environments(LayerBuilder(builder, cache, limits))
        by_class[name] = builders[id(builder)]
    return DeclaredEnvironment(by_class)


def build_drivers(
    settings: Settings, report: Callable[[str], None]
) -> tuple[dict[str, Driver], dict[str, str]]:
    """Every enabled class's driver, and why any could not be built (each
    reason also told to ``report``)."""
    drivers: dict[str, Driver] = {}
    missing: dict[str, str] = {}
    for name in classes.enabled_classes(settings):
        try:
            drivers[name] = classes.build_driver(settings, name)
        except Exception as exc:  # noqa: BLE001 - said; e.g. the vm driver's module is absent
            missing[name] = f"its driver could not be built: {exc}"
            report(f"podbay: sandbox class {name} unavailable: {exc}")
    return drivers, missing


def section_validator() -> SectionValidator:
    """Checks a deployment's ``sandbox`` section (raises naming every bad field)."""
    from podbay.environment.spec import parse_section

    return parse_section
