"""What attach may set on a new sandbox beyond its class: labels, variables,
CPU, memory and an idle timeout.

Every field is optional; an unset one means the server's setting (no labels,
no variables of its own, ``runtime.cpus``, ``runtime.memory_bytes``,
``lifecycle.idle_seconds``). The record keeps them as one JSON document
(:meth:`SandboxOptions.to_json`), so a store of an older schema version needs
one column, and a field added later needs none.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .egress import EgressPolicy


@dataclass(frozen=True)
class VolumeMount:
    """One of the deployment's volumes, mounted at ``path`` (absolute) in the sandbox."""

    path: str
    name: str
    read_only: bool = False


@dataclass(frozen=True, kw_only=True)
class SandboxOptions:
    #: The owner's string key/values, shown in records and matched by list filters.
    labels: Mapping[str, str] = field(default_factory=dict)
    #: Set for every command of the sandbox, over the declaration's ``env``.
    env: Mapping[str, str] = field(default_factory=dict)
    cpus: float | None = None
    memory_mib: int | None = None
    idle_timeout_seconds: int | None = None
    #: Where the sandbox may send packets. In an attach: what it asked for (None:
    #: not named). In a record: the policy in force (the deployment's default
    #: copied at creation, or what attach or ``PUT .../network`` set).
    network: EgressPolicy | None = None
    #: The deployment's volumes it mounts, sorted by path (docs/volumes.md).
    volumes: tuple[VolumeMount, ...] = ()

    @property
    def machine(self) -> bool:
        """Whether the machine itself differs from the server's default one
        (so a ready machine of the warm pool cannot serve: its rules are open)."""
        closed = self.network is not None and not self.network.open
        return (
            bool(self.env)
            or self.cpus is not None
            or self.memory_mib is not None
            or closed
            or bool(self.volumes)
        )

    def to_json(self) -> str | None:
        """The stored form; None when nothing is set (the column stays NULL)."""
        doc: dict[str, Any] = {}
        if self.labels:
            doc["labels"] = dict(self.labels)
        if self.env:
            doc["env"] = dict(self.env)
        for key in ("cpus", "memory_mib", "idle_timeout_seconds"):
            value = getattr(self, key)
            if value is not None:
                doc[key] = value
        if self.network is not None:
            doc["network"] = self.network.to_doc()
        if self.volumes:
            doc["volumes"] = [[v.path, v.name, v.read_only] for v in self.volumes]
        return json.dumps(doc, sort_keys=True) if doc else None

    @classmethod
    def from_json(cls, text: str | None) -> SandboxOptions:
        if not text:
            return cls()
        doc = json.loads(text)
        return cls(
            labels=dict(doc.get("labels") or {}),
            env=dict(doc.get("env") or {}),
            cpus=doc.get("cpus"),
            memory_mib=doc.get("memory_mib"),
            idle_timeout_seconds=doc.get("idle_timeout_seconds"),
            network=None if doc.get("network") is None else EgressPolicy.parse(doc["network"]),
            volumes=tuple(VolumeMount(p, n, bool(r)) for p, n, r in doc.get("volumes") or ()),
        )

    def matches(self, wanted: Mapping[str, str]) -> bool:
        """Whether every ``key=value`` of ``wanted`` is one of the labels."""
        return all(self.labels.get(k) == v for k, v in wanted.items())


NO_OPTIONS = SandboxOptions()
