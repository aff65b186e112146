"""The control services, built in one place for every control plane.

``podbay control`` (:class:`podbay.control.plane.ControlPlane`) and ``podbay
serve`` (:class:`podbay.serve.platform.Platform`) run the same services over
different parts: the cluster's nodes or the one local node, leases or
in-process name locks, a credential minted plainly or remembered by the local
gateway. Each passes its parts here, so the services are wired one way.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from podbay.dataplane.metrics import Metrics
from podbay.domain import Deployment
from podbay.host.volumes import VolumeStore
from podbay.settings import Settings
from podbay.store.base import Store

from ..keys import KeyRing, StoreKeyRing
from ..nodes import Nodes
from .deployments import DeploymentService, SectionValidator
from .lifecycle import Lifecycle, build_lifecycle
from .locks import NameLocks
from .sandboxes import SandboxService
from .transitions import Transitions
from .volumes import VolumeService

#: Mints a sandbox's data-plane credential: (sandbox id, incarnation) → (token, expiry).
Mint = Callable[[str, int], tuple[str, datetime]]


@dataclass(frozen=True)
class ControlServices:
    deployments: DeploymentService
    sandboxes: SandboxService
    #: None where no node can run a machine (``serve`` without a driver).
    transitions: Transitions | None
    lifecycle: Lifecycle | None
    volumes: VolumeService


def _and_remove_volumes(
    after_delete: Callable[[Deployment], Awaitable[None]] | None, volumes: VolumeStore
) -> Callable[[Deployment], Awaitable[None]]:
    """``after_delete``, then the deleted deployment's volumes removed (its id
    is gone: nothing could reach them again)."""

    async def after(deployment: Deployment) -> None:
        if after_delete is not None:
            await after_delete(deployment)
        await volumes.remove_deployment(deployment.id)

    return after


def build_control_services(
    settings: Settings,
    store: Store,
    keys: KeyRing | StoreKeyRing,
    *,
    nodes: Nodes,
    locks: NameLocks,
    metrics: Metrics,
    mint: Mint,
    clock: Callable[[], datetime],
    lifecycle: bool = True,
    validate_section: SectionValidator | None = None,
    deleted_marker: Path | None = None,
    after_delete: Callable[[Deployment], Awaitable[None]] | None = None,
    volumes: VolumeStore | None = None,
) -> ControlServices:
    """``lifecycle``: whether machines can run at all (transitions and the
    lifecycle pass are built only then). ``deleted_marker``/``after_delete``:
    how a deleted deployment reaches the gateways (see DeploymentService).
    ``volumes``: the host's volumes (the all-in-one server's node keeps them)."""
    if volumes is not None:
        after_delete = _and_remove_volumes(after_delete, volumes)
    transitions, passes = (
        build_lifecycle(store, nodes, metrics, locks, settings.lifecycle, clock)
        if lifecycle
        else (None, None)
    )
    deployments = DeploymentService(
        store,
        keys,
        issuer=settings.server.base_url(),
        identity_ttl_seconds=settings.credentials.identity_ttl_seconds,
        validate_section=validate_section,
        clock=clock,
        deleted_marker=deleted_marker,
        # Shared keys: a token signed by a key another replica or the CLI just
        # made is checked again after re-reading them.
        refresh_keys=keys.refresh_if_stale if isinstance(keys, StoreKeyRing) else None,
        after_delete=after_delete,
    )
    sandboxes = SandboxService(
        settings=settings,
        store=store,
        nodes=nodes,
        transitions=transitions,
        locks=locks,
        clock=clock,
        mint=mint,
    )
    volume_service = VolumeService(store, volumes)
    if volumes is not None:
        sandboxes.check_volumes = volume_service.check_attach
    return ControlServices(deployments, sandboxes, transitions, passes, volume_service)
