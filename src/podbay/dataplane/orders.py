"""What the control plane orders a node to make: a new sandbox's machine
(:class:`Launch`) and a stopped machine's disk to fetch (:class:`Transfer`).
Both planes use them: the control plane builds them, a node carries them out."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from podbay.domain.egress import OPEN, EgressPolicy
from podbay.domain.options import VolumeMount
from podbay.runtime.base import Limits


@dataclass(frozen=True)
class Launch:
    """A new sandbox's machine, as the control plane orders it."""

    class_: str
    machine_id: str
    hostname: str
    labels: Mapping[str, str]
    #: Whether ``machine_id`` came ready from the node's warm pool.
    pooled: bool
    #: The sandbox's own variables (over the environment's) and limits (None:
    #: the node's); a pooled machine has none of them.
    env: Mapping[str, str] = field(default_factory=dict)
    cpus: float | None = None
    memory_bytes: int | None = None
    #: Where it may send packets (a pooled machine's rules are open).
    egress: EgressPolicy = OPEN
    #: The deployment's volumes to bind (docs/volumes.md); a pooled machine has none.
    volumes: tuple[VolumeMount, ...] = ()

    def limits(self, default: Limits) -> Limits:
        """The machine's limits: the node's ``default`` with the sandbox's own."""
        return replace(
            default,
            cpus=default.cpus if self.cpus is None else self.cpus,
            memory_bytes=default.memory_bytes if self.memory_bytes is None else self.memory_bytes,
        )


@dataclass(frozen=True)
class Transfer:
    """A stopped machine's disk to fetch from the node holding it: that node's
    URL and a disk pass the control plane signed for this one fetch."""

    class_: str
    machine_id: str
    source_url: str
    token: str
    #: The sandbox's own variables, over the target's build of its environment.
    env: Mapping[str, str] = field(default_factory=dict)
