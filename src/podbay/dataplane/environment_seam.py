"""The seam between sandboxes and declared environments, below both planes:
the control plane and the node use it and never import
:mod:`podbay.environment`, which implements it (as a test's fake can), so
either runs without the builder.

The sandbox service asks an :class:`EnvironmentService` two things:

* :meth:`~EnvironmentService.prepare` before a *fresh* machine of a class
  is made: the layers and env it needs (:class:`Prepared`), or "still building, come
  back" (:class:`Building` → the attach answers 202 + ``Retry-After``), or
  it raises ``ApiError(SANDBOX_PREPARE_FAILED, ...)``.
* :meth:`~EnvironmentService.apply` once that fresh machine runs: setup
  commands in ``/workspace``; raises ``ApiError(SANDBOX_APPLY_FAILED, ...)``,
  after which the sandbox service destroys the machine and drops the row.

:class:`PlainEnvironment` is the environment of a section without packages:
nothing to build, nothing to apply.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from podbay.domain import Deployment
from podbay.runtime.base import Driver
from podbay.wire.control import BuildStep


@dataclass(frozen=True)
class Prepared:
    #: Identifies the built environment (layer hash); ``""`` for the plain base.
    #: Machines in the warm pool are kept per key.
    key: str = ""
    layers: tuple[Path, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Building:
    """The environment is still being built: ask again after ``retry_after_seconds``."""

    retry_after_seconds: int
    #: Completes when the build ends (either way), where there is one to wait
    #: for: attach holds the request on it for a while before answering 202.
    done: asyncio.Future[Any] | None = field(default=None, compare=False, repr=False)
    #: The build's current step, where this process runs it (the 202 shows it).
    progress: BuildStep | None = None


class EnvironmentService(Protocol):
    async def prepare(self, deployment: Deployment, class_: str) -> Prepared | Building: ...

    async def apply(self, deployment: Deployment, driver: Driver, machine_id: str) -> None: ...


class PlainEnvironment:
    """Every deployment gets the base image as is."""

    async def prepare(self, deployment: Deployment, class_: str) -> Prepared | Building:
        return Prepared()

    async def apply(self, deployment: Deployment, driver: Driver, machine_id: str) -> None:
        return None
