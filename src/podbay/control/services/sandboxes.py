"""Sandboxes as a deployment sees them: attach, get, list, stop, delete.

Every transition of one sandbox happens under its name lock; the store's
unique (deployment, name) and compare-and-set writes guard against other
processes (the CLI). A deployment only ever looks up ``(its id, name)``, so
another deployment's sandbox is exactly as invisible as a missing one.

Attach's ``class`` picks the isolation level of a *new* sandbox
(:class:`~.classes.ClassRuntimes` resolves ``default``); the record keeps
the class actually used. An existing sandbox is reused with ``default`` or
its own class named; naming another class is 409 ``SANDBOX_CLASS_CONFLICT``
rather than a silent change of isolation (delete it to change class).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import TypeVar

from podbay.domain import Deployment, Sandbox, SandboxState, StartKind
from podbay.domain.sandbox import new_machine_id, new_sandbox_id
from podbay.errors import ApiError
from podbay.gateway.activity import ActivityTracker
from podbay.runtime.base import Driver, Limits, MachineSpec
from podbay.runtime.classes import is_class_name
from podbay.runtime.hostdisk import reserve_shortfall
from podbay.settings import Settings
from podbay.store.base import InsertOutcome, Store
from podbay.wire.codes import ErrorCode
from podbay.wire.limits import DEFAULT_SANDBOX_CLASS, is_valid_sandbox_name

from .classes import ClassRuntimes
from .environment import Building, EnvironmentService
from .locks import NameLocks
from .pool import WarmPool
from .transitions import Transitions

T = TypeVar("T")

log = logging.getLogger("podbay.sandboxes")
S = SandboxState
LABEL_SANDBOX = "podbay.sandbox"
LABEL_DEPLOYMENT = "podbay.deployment"
LABEL_NAME = "podbay.name"


#: Why attach is refused while the server starts (a temporary 503).
STARTING = "the sandbox runtime is still starting; try again shortly"


@dataclass(frozen=True)
class Attached:
    sandbox: Sandbox
    start: StartKind
    credential: str
    expires_at: datetime


def hostname_for(name: str) -> str:
    """A sandbox name as an RFC 1123 hostname label."""
    label = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")[:63].strip("-")
    return label or "sandbox"


def not_found(name: str) -> ApiError:
    # Same sentence whether the name is free or another deployment's.
    return ApiError(ErrorCode.SANDBOX_NOT_FOUND, f"no sandbox named {name!r}")


def check_name(name: str) -> None:
    if not is_valid_sandbox_name(name):
        raise ApiError(
            ErrorCode.SANDBOX_NAME_INVALID,
            "sandbox names match ^[A-Za-z0-9][A-Za-z0-9._:-]{0,127}$",
        )


class SandboxService:
    def __init__(
        self,
        *,
        settings: Settings,
        store: Store,
        classes: ClassRuntimes,
        transitions: Transitions | None,
        environment: EnvironmentService,
        activity: ActivityTracker,
        locks: NameLocks,
        pools: Mapping[str, WarmPool],
        mint: Callable[[str, int], tuple[str, datetime]],
        clock: Callable[[], datetime],
    ) -> None:
        self.settings = settings
        self.store = store
        self.classes = classes
        self.transitions = transitions
        self.environment = environment
        self.activity = activity
        self.locks = locks
        #: Warm pools by class.
        self.pools = pools
        self.mint = mint
        self.clock = clock
        #: False until the runtime is prepared and reconciled (set by the app).
        self.ready = False
        self.not_ready_reason = STARTING
        self.max_age = timedelta(seconds=settings.lifecycle.max_age_seconds)
        rt = settings.runtime
        self.limits = Limits(
            memory_bytes=rt.memory_bytes, cpus=rt.cpus, pids=rt.pids, disk_bytes=rt.disk_bytes
        )

    # -- reads -------------------------------------------------------------------
    async def get(self, deployment: Deployment, name: str) -> Sandbox:
        check_name(name)
        row = await self.store.get_sandbox(deployment.id, name)
        if row is None or not row.state.visible:
            raise not_found(name)
        return self._with_activity(row)

    async def list(self, deployment: Deployment) -> list[Sandbox]:
        rows = await self.store.list_sandboxes(deployment_id=deployment.id)
        return [self._with_activity(r) for r in rows if r.state.visible]

    def _with_activity(self, row: Sandbox) -> Sandbox:
        seen = self.activity.last(row.id)
        if seen is not None and seen > row.last_active_at:
            return replace(row, last_active_at=seen)
        return row

    # -- attach ------------------------------------------------------------------
    async def attach(self, deployment: Deployment, name: str, class_: str) -> Attached | Building:
        check_name(name)
        if not is_class_name(class_):
            self.classes.resolve(class_)  # raises SANDBOX_CLASS_UNKNOWN
        if not deployment.declares_sandbox:
            raise ApiError(
                ErrorCode.SANDBOX_NOT_DECLARED,
                f"deployment {deployment.name!r} declares no sandbox section",
            )
        transitions = self._runtime()
        async with self.locks.hold(deployment.id, name):
            for _ in range(5):
                row = await self.store.get_sandbox(deployment.id, name)
                result: Attached | Building | None
                if row is not None and row.state.visible:
                    self._check_class(row, class_)
                if row is None:
                    result = await self._create(deployment, name, self.classes.resolve(class_))
                elif row.state is S.RUNNING:
                    result = self._reuse(row, transitions)
                elif row.state is S.SUSPENDED:
                    result = await self._bring_up(row, "resumed", transitions.resume)
                elif row.state is S.STOPPED:
                    result = await self._bring_up(
                        row, "carried_over", transitions.start_fresh_compute
                    )
                else:
                    # creating/deleting under our lock: left by a crash or by the
                    # CLI; finish it, then attach afresh.
                    await self._quietly(transitions.destroy(row, "stale on attach"))
                    continue
                if result is not None:
                    return result
            raise ApiError(
                ErrorCode.SANDBOX_START_FAILED,
                "the sandbox kept changing under the attach; try again",
            )

    def _runtime(self) -> Transitions:
        if not self.classes.drivers or self.transitions is None:
            raise ApiError(ErrorCode.SANDBOXES_UNAVAILABLE, "this server runs no sandboxes")
        if not self.ready:
            # While starting, the refusal is temporary (clients wait and repeat);
            # once start-up failed, it is not.
            starting = self.not_ready_reason == STARTING
            raise ApiError(
                ErrorCode.SANDBOXES_UNAVAILABLE,
                self.not_ready_reason,
                retry_after=1 if starting else None,
            )
        return self.transitions

    def _check_class(self, row: Sandbox, asked: str) -> None:
        """An existing sandbox keeps its class: asking for another one by name is a
        conflict, and a class this server no longer runs cannot bring it up."""
        if asked not in (DEFAULT_SANDBOX_CLASS, row.class_):
            raise ApiError(
                ErrorCode.SANDBOX_CLASS_CONFLICT,
                f"sandbox {row.name!r} exists with class {row.class_!r}, not "
                f"{asked!r}; attach with class 'default' or {row.class_!r}, "
                "or delete it first to change its class",
            )
        self.classes.require(row.class_)

    def _attached(self, row: Sandbox, start: StartKind) -> Attached:
        token, expires = self.mint(row.id, row.incarnation)
        return Attached(row, start, token, expires)

    def _reuse(self, row: Sandbox, transitions: Transitions) -> Attached:
        if row.id not in transitions.routes:
            transitions.add_route(row)
        self.activity.touch(row.id)
        return self._attached(replace(row, last_active_at=self.clock()), "reused")

    async def _bring_up(
        self,
        row: Sandbox,
        start: StartKind,
        step: Callable[[Sandbox, str], Awaitable[Sandbox | None]],
    ) -> Attached | None:
        try:
            new = await step(row, f"attach ({start})")
        except Exception as exc:
            log.exception("sandbox %s: %s failed", row.id, start)
            raise ApiError(
                ErrorCode.SANDBOX_START_FAILED, f"the sandbox could not be brought up: {exc}"
            ) from None
        return None if new is None else self._attached(new, start)

    async def _create(
        self, deployment: Deployment, name: str, class_: str
    ) -> Attached | Building | None:
        driver = self.classes.driver(class_)
        short = reserve_shortfall(self.settings.data_dir, self.settings.runtime.disk_reserve_bytes)
        if short is not None:
            log.warning("attach refused: %s", short)
            raise ApiError(ErrorCode.HOST_DISK_FULL, short)
        prepared = await self.environment.prepare(deployment, class_)
        if isinstance(prepared, Building):
            return prepared
        now = self.clock()
        pool = self.pools.get(class_)
        pooled = pool.take(prepared) if pool is not None else None
        row = Sandbox(
            id=new_sandbox_id(),
            deployment_id=deployment.id,
            account=deployment.account,
            name=name,
            class_=class_,
            state=S.CREATING,
            machine_id=pooled or new_machine_id(),
            created_at=now,
            last_active_at=now,
            started_at=None,
            ceiling_at=None,
        )
        outcome = await self.store.insert_sandbox(
            row,
            deployment_cap=self.settings.caps.per_deployment,
            account_cap=self.settings.caps.per_account,
        )
        if outcome is not InsertOutcome.INSERTED:
            if pooled is not None and pool is not None:
                pool.give_back(prepared, pooled)
            if outcome is InsertOutcome.EXISTS:
                return None
            raise self._cap_refusal(outcome)
        labels = {LABEL_SANDBOX: row.id, LABEL_DEPLOYMENT: deployment.id, LABEL_NAME: name}
        try:
            if pooled is not None:
                await driver.assign(pooled, hostname=hostname_for(name), labels=labels)
            else:
                await driver.create(
                    MachineSpec(
                        machine_id=row.machine_id,
                        hostname=hostname_for(name),
                        limits=self.limits,
                        env=dict(prepared.env),
                        layers=prepared.layers,
                        labels=labels,
                    )
                )
                await driver.start(row.machine_id)
            await self.environment.apply(deployment, driver, row.machine_id)
        except ApiError:
            await self._undo_create(row, driver)
            raise
        except Exception as exc:
            log.exception("sandbox %s: start failed", row.id)
            await self._undo_create(row, driver)
            raise ApiError(
                ErrorCode.SANDBOX_START_FAILED, f"the sandbox could not be started: {exc}"
            ) from None
        new = await self.store.replace_sandbox(row, row.started(self.clock(), self.max_age))
        if new is None:  # the deployment was deleted meanwhile
            await self._undo_create(row, driver)
            raise not_found(name)
        assert self.transitions is not None
        self.transitions.add_route(new)
        self.transitions.metrics.transition("none", "running")
        return self._attached(new, "created")

    async def _undo_create(self, row: Sandbox, driver: Driver) -> None:
        """Leave nothing half-made: the machine destroyed, the row gone."""
        try:
            await driver.destroy(row.machine_id)
        except Exception:
            log.exception("sandbox %s: destroy after a failed start failed", row.id)
            return  # the creating row stays; the next reconcile destroys and drops it
        await self.store.delete_sandbox(row)

    def _cap_refusal(self, outcome: InsertOutcome) -> ApiError:
        if outcome is InsertOutcome.DEPLOYMENT_CAP:
            return ApiError(
                ErrorCode.SANDBOX_LIMIT_REACHED,
                f"this deployment holds its limit of "
                f"{self.settings.caps.per_deployment} sandboxes; delete one first",
            )
        return ApiError(
            ErrorCode.SANDBOX_LIMIT_REACHED,
            f"this account holds its limit of {self.settings.caps.per_account}"
            " sandboxes; delete one first",
        )

    # -- stop, delete ------------------------------------------------------------------
    async def stop(self, deployment: Deployment, name: str) -> None:
        """Suspend compute early; a sandbox that runs nothing is left as it is."""
        check_name(name)
        transitions = self._runtime()
        async with self.locks.hold(deployment.id, name):
            row = await self.store.get_sandbox(deployment.id, name)
            if row is None or not row.state.visible:
                raise not_found(name)
            if row.state is S.RUNNING:
                await self._checked(transitions.suspend(row, "stop"))

    async def delete(self, deployment: Deployment, name: str) -> None:
        check_name(name)
        transitions = self._runtime()
        async with self.locks.hold(deployment.id, name):
            row = await self.store.get_sandbox(deployment.id, name)
            if row is None:
                raise not_found(name)
            for _ in range(5):
                if row is None or await self._checked(transitions.destroy(row, "delete")):
                    return
                row = await self.store.get_sandbox(deployment.id, name)

    async def _checked(self, step: Awaitable[T]) -> T:
        try:
            return await step
        except ApiError:
            raise
        except Exception as exc:
            log.exception("sandbox operation failed")
            raise ApiError(ErrorCode.INTERNAL, f"the runtime could not do that: {exc}") from None

    @staticmethod
    async def _quietly(step: Awaitable[object]) -> None:
        try:
            await step
        except Exception:
            log.exception("cleanup failed")
