"""Declared environments for the sandbox service (the control plane's seam).

:class:`DeclaredEnvironment` implements the control plane's
``EnvironmentService``: before a fresh machine it answers the layers and
env the deployment's section needs (or "still building": a 202), and once
the fresh machine runs it applies the setup commands in ``/workspace``.
Refusals carry the contract's codes: ``SANDBOX_PREPARE_FAILED`` naming the
failing step with the end of its output, ``SANDBOX_APPLY_FAILED`` naming
the setup command with its output.

Layers are kept per sandbox class's :class:`Environments`; classes whose
drivers stand on the same base image share one (and so every layer).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping

from podbay.dataplane.environment_seam import Building, Prepared
from podbay.domain import Deployment
from podbay.errors import ApiError
from podbay.runtime.base import Driver
from podbay.wire.codes import ErrorCode

from .build import Environments, Failed, SetupFailed, run_setup
from .plan import NODE_GLOBAL_MODULES
from .spec import SandboxSection, SpecError, parse_section


class DeclaredEnvironment:
    def __init__(self, environments: Mapping[str, Environments]) -> None:
        #: By sandbox class.
        self.environments = dict(environments)

    @staticmethod
    def section(deployment: Deployment) -> SandboxSection:
        if deployment.sandbox_section is None:
            raise ApiError(
                ErrorCode.SANDBOX_NOT_DECLARED,
                f"deployment {deployment.name!r} declares no sandbox section",
            )
        try:
            return parse_section(deployment.sandbox_section)
        except SpecError as exc:
            # Registered before validation existed, or edited by hand.
            raise ApiError(
                ErrorCode.SANDBOX_PREPARE_FAILED, f"the sandbox section is not valid: {exc}"
            ) from None

    async def prepare(self, deployment: Deployment, class_: str) -> Prepared | Building:
        section = self.section(deployment)
        state = self.environments[class_].status(section)
        if isinstance(state, Building):
            return state
        if isinstance(state, Failed):
            raise ApiError(
                ErrorCode.SANDBOX_PREPARE_FAILED,
                f"preparing the sandbox environment failed: {state.error}",
            )
        return Prepared(key=pool_key(section), layers=state.layers, env=sandbox_env(section))

    async def apply(self, deployment: Deployment, driver: Driver, machine_id: str) -> None:
        section = self.section(deployment)
        if not section.setup:
            return
        try:
            await run_setup(driver.agent_socket(machine_id), section)
        except SetupFailed as exc:
            raise ApiError(ErrorCode.SANDBOX_APPLY_FAILED, str(exc)) from None

    async def close(self) -> None:
        for environments in {id(e): e for e in self.environments.values()}.values():
            await environments.close()


def sandbox_env(section: SandboxSection) -> dict[str, str]:
    """The env of every command: the declared one, plus ``NODE_PATH`` where Node
    is declared so that ``require()`` finds globally installed packages."""
    env = {"NODE_PATH": NODE_GLOBAL_MODULES} if section.node is not None else {}
    return {**env, **section.env}


def pool_key(section: SandboxSection) -> str:
    """Machines are interchangeable when their layers and env are: the pool's key."""
    if section.is_empty_install and not section.env:
        return ""
    raw = json.dumps(
        {"layer": section.layer_key(), "env": dict(sorted(section.env.items()))}, sort_keys=True
    )
    return hashlib.sha256(raw.encode()).hexdigest()
