"""Sandboxes as a deployment sees them: attach, get, list, stop, delete.

Every transition of one sandbox happens under its name lock; the store's
unique (deployment, name) and compare-and-set writes guard against other
processes (the CLI). A deployment only ever looks up ``(its id, name)``, so
another deployment's sandbox is exactly as invisible as a missing one.

Attach's ``class`` picks the isolation level of a *new* sandbox
(:class:`~.classes.ClassRuntimes` resolves ``default``); the record keeps
the class actually used (``class_``, shown as ``runtime_class``) beside the
word it was asked for (``asked_class``, shown as ``class``: the reference
contract's handles say "Always ``default``"). An existing sandbox is reused with ``default`` or
its own class named; naming another class is 409 ``SANDBOX_CLASS_CONFLICT``
rather than a silent change of isolation (delete it to change class).
Its other options (labels, variables, CPU, memory, idle timeout) follow the
same rule (:mod:`.options`).
"""

from __future__ import annotations

import asyncio
import builtins
import json
import logging
import re
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import TypeVar

from podbay.dataplane.environment_seam import Building
from podbay.dataplane.orders import Launch
from podbay.domain import Deployment, Sandbox, SandboxOptions, SandboxState, StartKind
from podbay.domain.egress import OPEN, EgressDestination, EgressPolicy
from podbay.domain.options import NO_OPTIONS
from podbay.domain.sandbox import new_machine_id, new_sandbox_id
from podbay.errors import ApiError, DriverError, MachineNotFound
from podbay.runtime.base import ForkCopy
from podbay.runtime.classes import is_class_name
from podbay.settings import Settings
from podbay.store.base import InsertOutcome, Store
from podbay.wire.codes import ErrorCode
from podbay.wire.limits import DEFAULT_SANDBOX_CLASS, MAX_FORK_COPIES, is_valid_sandbox_name

from ..nodes import Node, Nodes
from .locks import NameLocks
from .options import check_same, with_default_network
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
    #: The data plane's base URL for this sandbox (on the node that holds it).
    endpoint: str


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
    # Collaborators come in built (the composition root wires them), so a test
    # hands in fakes and no service builds another behind the caller's back.
    def __init__(
        self,
        *,
        settings: Settings,
        store: Store,
        nodes: Nodes,
        transitions: Transitions | None,
        locks: NameLocks,
        mint: Callable[[str, int], tuple[str, datetime]],
        clock: Callable[[], datetime],
    ) -> None:
        self.settings = settings
        self.store = store
        self.nodes = nodes
        self.transitions = transitions
        self.locks = locks
        self.mint = mint
        self.clock = clock
        #: False until the runtime is prepared and reconciled (set by the app).
        self.ready = False
        self.not_ready_reason = STARTING
        #: Waits for a pending check of the sandbox's machine (its agent went
        #: quiet: the gateway answered 502), True if there was one; set by the app.
        self.settle: Callable[[str], Awaitable[bool]] | None = None
        self.max_age = timedelta(seconds=settings.lifecycle.max_age_seconds)
        #: Refuses a new sandbox's volumes its class cannot mount or that do not
        #: exist (VolumeService.check_attach); None: no volume is asked for then.
        self.check_volumes: Callable[[Deployment, str, SandboxOptions], None] | None = None

    # -- reads -------------------------------------------------------------------
    def lost(self, row: Sandbox) -> bool:
        """Its node stopped answering (it is reported ``lost``)."""
        return not self.nodes.reachable(row)

    async def get(self, deployment: Deployment, name: str) -> Sandbox:
        check_name(name)
        await self.nodes.refresh()
        row = await self.store.get_sandbox(deployment.id, name)
        if row is None or not row.state.visible:
            raise not_found(name)
        return self._with_activity(row)

    async def list(
        self, deployment: Deployment, labels: Mapping[str, str] | None = None
    ) -> list[Sandbox]:
        """This deployment's sandboxes; with ``labels``, those carrying them all."""
        rows = await self.store.list_sandboxes(deployment_id=deployment.id)
        await self.nodes.refresh()
        return [
            self._with_activity(r)
            for r in rows
            if r.state.visible and (not labels or r.options.matches(labels))
        ]

    def _with_activity(self, row: Sandbox) -> Sandbox:
        try:
            seen = self.nodes.of(row).last_seen(row.id)
        except ApiError:  # its node is out of reach: the store's figure is all there is
            return row
        if seen is not None and seen > row.last_active_at:
            return replace(row, last_active_at=seen)
        return row

    # -- attach ------------------------------------------------------------------
    async def attach_holding(
        self,
        deployment: Deployment,
        name: str,
        class_: str,
        options: SandboxOptions,
        hold_seconds: float,
    ) -> Attached | Building:
        """:meth:`attach`, held up to ``hold_seconds`` while the sandbox's
        environment builds: a build that ends meanwhile is attached again, so
        its caller hears "ready" rather than "building" (a client that predates
        202 knows only 200). Building is returned once the hold is over."""
        result = await self.attach(deployment, name, class_, options)
        hold_until = time.monotonic() + hold_seconds
        while isinstance(result, Building) and result.done is not None:
            left = hold_until - time.monotonic()
            if left <= 0:
                break
            await asyncio.wait({result.done}, timeout=left)
            if not result.done.done():
                break
            result = await self.attach(deployment, name, class_, options)
        return result

    async def attach(
        self,
        deployment: Deployment,
        name: str,
        class_: str,
        options: SandboxOptions = NO_OPTIONS,
    ) -> Attached | Building:
        """``options`` are checked already (:func:`.options.options_of`)."""
        check_name(name)
        if not is_class_name(class_):
            self.nodes.resolve(class_)  # raises SANDBOX_CLASS_UNKNOWN
        if not deployment.declares_sandbox:
            raise ApiError(
                ErrorCode.SANDBOX_NOT_DECLARED,
                f"deployment {deployment.name!r} declares no sandbox section",
            )
        transitions = self._runtime()
        await self.nodes.refresh()
        stamp = self.locks.stamp(deployment.id, name)
        row = await self.store.get_sandbox(deployment.id, name)
        fast = await self._reuse_published(row, class_, options)
        if fast is not None:
            return fast
        async with self.locks.hold(deployment.id, name):
            for attempt in range(5):
                # The row read above serves when no transition can have run since
                # (a resume or a create then waits for one hop to the store's
                # thread less, which under load is milliseconds).
                if attempt or not self.locks.unchanged_since(stamp):
                    row = await self.store.get_sandbox(deployment.id, name)
                result: Attached | Building | None
                if row is not None and row.state.visible:
                    self.nodes.of(row)  # refuses a sandbox whose node is lost
                    self._check_class(row, class_)
                    check_same(row, options)
                if row is None:
                    result = await self._create(
                        deployment, name, self.nodes.resolve(class_), class_, options
                    )
                elif row.state is S.RUNNING:
                    result = await self._reuse(row, transitions)
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
        if self.transitions is None:
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
        self.nodes.require(row.class_)

    def _attached(self, row: Sandbox, start: StartKind, node: Node | None = None) -> Attached:
        token, expires = self.mint(row.id, row.incarnation)
        endpoint = (node or self.nodes.of(row)).endpoint(row.id)
        return Attached(row, start, token, expires, endpoint)

    async def _reuse_published(
        self, row: Sandbox | None, class_: str, options: SandboxOptions
    ) -> Attached | None:
        """A running sandbox whose route its node holds, without the sandbox's
        lock (in a cluster a lease: two writes to the store) or a call to the
        node: nothing changes, so there is nothing to serialize. A transition
        racing it is as if it came just after this attach (the credential then
        fails with SANDBOX_NOT_RUNNING and the client attaches again). None:
        take the locked path. ``row`` was read without the lock."""
        if row is None or row.state is not S.RUNNING:
            return None
        # A machine under suspicion (a dead gVisor sandbox's route is still up):
        # once its check has recorded what it found, the locked path reads anew.
        if self.settle is not None and await self.settle(row.id):
            return None
        node = self.nodes.of(row)  # refuses a sandbox whose node is lost
        self._check_class(row, class_)
        check_same(row, options)
        if not node.routed(row):
            return None
        return self._touched(row, node)

    async def _reuse(self, row: Sandbox, transitions: Transitions) -> Attached:
        node = self.nodes.of(row)
        if not node.routed(row):
            try:
                await transitions.add_route(row)
            except ApiError as exc:
                # The row carries a route mark, so its node took the route; this
                # replica's view of the node may predate the node's last start,
                # and a node that stopped answering is not lost until its
                # heartbeats time out. Until then attach answers from the store,
                # as the unlocked path does: the caller's calls then fail to
                # connect, which is safe to repeat.
                if row.routed_on is None or exc.code is not ErrorCode.SANDBOX_START_FAILED:
                    raise
                log.warning("sandbox %s: its node did not take the route again: %s", row.id, exc)
        return self._touched(row, node)

    def _touched(self, row: Sandbox, node: Node) -> Attached:
        node.touch(row.id)
        return self._attached(replace(row, last_active_at=self.clock()), "reused", node)

    async def _bring_up(
        self,
        row: Sandbox,
        start: StartKind,
        step: Callable[[Sandbox, str], Awaitable[Sandbox | None]],
    ) -> Attached | None:
        try:
            new = await step(row, f"attach ({start})")
        except Exception as exc:
            if isinstance(exc, ApiError) and exc.retry_after is not None:
                raise  # temporary (the store away, a node starting): the client repeats
            log.exception("sandbox %s: %s failed", row.id, start)
            raise ApiError(
                ErrorCode.SANDBOX_START_FAILED, f"the sandbox could not be brought up: {exc}"
            ) from None
        return None if new is None else self._attached(new, start)

    async def _create(
        self,
        deployment: Deployment,
        name: str,
        class_: str,
        asked: str,
        options: SandboxOptions,
    ) -> Attached | Building | None:
        if options.volumes:
            if self.check_volumes is None:
                raise ApiError(ErrorCode.VOLUMES_UNAVAILABLE, "this server keeps no volumes")
            self.check_volumes(deployment, class_, options)
        node = await self.nodes.place(class_)
        short = await node.shortfall()
        if short is not None:
            log.warning("attach refused: %s", short)
            raise ApiError(ErrorCode.HOST_DISK_FULL, short)
        prepared = await node.prepare(deployment, class_)
        if isinstance(prepared, Building):
            return prepared
        now = self.clock()
        options = with_default_network(options, deployment)
        # A pooled machine was made with the server's limits, variables and open rules.
        pooled = None if options.machine else await node.take_warm(class_, prepared)
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
            node=node.name,
            asked_class=asked,
            options=options,
        )
        assert self.transitions is not None
        events = self.transitions.events
        outcome = await self.store.insert_sandbox(
            row,
            deployment_cap=self.settings.caps.per_deployment,
            account_cap=self.settings.caps.per_account,
            event=events.event("created", f"class {class_} on node {node.name}"),
        )
        if outcome is not InsertOutcome.INSERTED:
            if pooled is not None:
                await node.give_back(class_, prepared, pooled)
            if outcome is InsertOutcome.EXISTS:
                return None
            raise self._cap_refusal(outcome)
        labels = {LABEL_SANDBOX: row.id, LABEL_DEPLOYMENT: deployment.id, LABEL_NAME: name}
        order = Launch(
            class_,
            row.machine_id,
            hostname_for(name),
            labels,
            pooled is not None,
            env=dict(options.env),
            cpus=options.cpus,
            memory_bytes=None if options.memory_mib is None else options.memory_mib << 20,
            egress=options.network or OPEN,
            volumes=options.volumes,
        )
        try:
            await node.launch(order, prepared, deployment)
        except ApiError:
            await self._undo_create(row, node)
            raise
        except Exception as exc:
            log.exception("sandbox %s: start failed", row.id)
            await self._undo_create(row, node)
            raise ApiError(
                ErrorCode.SANDBOX_START_FAILED, f"the sandbox could not be started: {exc}"
            ) from None
        ready = events.event("ready", "pooled machine" if pooled else "booted")
        new = await self.store.replace_sandbox(row, row.started(self.clock(), self.max_age), ready)
        if new is None:  # the deployment was deleted meanwhile
            await self._undo_create(row, node)
            raise not_found(name)
        await self.transitions.add_route(new)
        self.transitions.metrics.transition("none", "running")
        return self._attached(new, "created", node)

    async def _undo_create(self, row: Sandbox, node: Node) -> None:
        """Leave nothing half-made: the machine destroyed, the row gone."""
        try:
            await node.destroy(row.class_, row.machine_id)
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

    # -- fork --------------------------------------------------------------------------
    async def fork(
        self, deployment: Deployment, name: str, new_names: Sequence[str]
    ) -> tuple[builtins.list[Attached], float]:
        """Copy sandbox ``name`` into a new running sandbox per name in
        ``new_names`` (docs/fork.md): its files now, its class, options and
        egress policy; each its own id, machine, hostname, credentials and
        network. The new sandboxes in order, and how long a running source
        was held still. Either all of them are made or none is left."""
        check_name(name)
        for new_name in new_names:
            check_name(new_name)
        check_fork_names(name, new_names)
        transitions = self._runtime()
        await self.nodes.refresh()
        async with AsyncExitStack() as held_locks:
            # Sorted: two forks naming each other's sandboxes take them in one order.
            for locked in sorted({name, *new_names}):
                await held_locks.enter_async_context(self.locks.hold(deployment.id, locked))
            row = await self.store.get_sandbox(deployment.id, name)
            if row is None or not row.state.visible:
                raise not_found(name)
            if row.state is S.CREATING:
                raise ApiError(
                    ErrorCode.SANDBOX_FORK_UNSUPPORTED,
                    f"sandbox {name!r} is still being made; fork it once it runs",
                    retry_after=1.0,
                )
            node = self.nodes.of(row)  # refuses a sandbox whose node is lost
            if not node.can_fork(row.class_):
                raise ApiError(
                    ErrorCode.SANDBOX_FORK_UNSUPPORTED,
                    f"sandboxes of class {row.class_!r} cannot be forked here",
                )
            for new_name in new_names:
                if await self.store.get_sandbox(deployment.id, new_name) is not None:
                    raise _name_taken(new_name)
            short = await node.shortfall()
            if short is not None:
                raise ApiError(ErrorCode.HOST_DISK_FULL, short)
            made: dict[str, Sandbox] = {}
            try:
                return await self._fork_into(transitions, row, node, new_names, made)
            except BaseException as exc:
                for new in made.values():
                    await self._quietly(node.withdraw(new.id))
                    await self._undo_create(new, node)
                if isinstance(exc, ApiError | asyncio.CancelledError):
                    raise
                if not isinstance(exc, Exception):
                    raise
                log.exception("sandbox %s: fork failed", row.id)
                raise ApiError(
                    ErrorCode.SANDBOX_START_FAILED, f"the sandbox could not be forked: {exc}"
                ) from None

    async def _fork_into(
        self,
        transitions: Transitions,
        row: Sandbox,
        node: Node,
        new_names: Sequence[str],
        made: dict[str, Sandbox],
    ) -> tuple[builtins.list[Attached], float]:
        """:meth:`fork`'s steps, under the locks; ``made`` holds each new row as
        it last was written, for the caller to remove on failure."""
        now = self.clock()
        for new_name in new_names:
            new = replace(
                row,
                id=new_sandbox_id(),
                name=new_name,
                state=S.CREATING,
                machine_id=new_machine_id(),
                created_at=now,
                last_active_at=now,
                started_at=None,
                ceiling_at=None,
                incarnation=0,
                version=0,
                suspended_at=None,
                routed_on=None,
            )
            outcome = await self.store.insert_sandbox(
                new,
                deployment_cap=self.settings.caps.per_deployment,
                account_cap=self.settings.caps.per_account,
                event=transitions.events.event(
                    "created", f"forked from {row.name!r}, class {row.class_} on node {node.name}"
                ),
            )
            if outcome is InsertOutcome.EXISTS:
                raise _name_taken(new_name)
            if outcome is not InsertOutcome.INSERTED:
                raise self._cap_refusal(outcome)
            made[new_name] = new
        copies = [
            ForkCopy(
                machine_id=new.machine_id,
                hostname=hostname_for(new.name),
                labels={
                    LABEL_SANDBOX: new.id,
                    LABEL_DEPLOYMENT: new.deployment_id,
                    LABEL_NAME: new.name,
                },
            )
            for new in made.values()
        ]
        held = await node.fork(row.class_, row.machine_id, copies)
        for new in made.values():
            # One after another: four vm guests booting side by side under TCG
            # outlasted the start timeout on a loaded 2-core host (bench/fork.py).
            await node.start(new.class_, new.machine_id)
        attached: builtins.list[Attached] = []
        for new_name, new in list(made.items()):
            ready = transitions.events.event("ready", f"forked from {row.name!r}")
            started = await self.store.replace_sandbox(
                new, new.started(self.clock(), self.max_age), ready
            )
            if started is None:  # the deployment was deleted meanwhile
                raise not_found(new_name)
            made[new_name] = started
            await transitions.add_route(started)
            transitions.metrics.transition("none", "running")
            attached.append(self._attached(started, "created", node))
        names = ", ".join(repr(n) for n in new_names)
        await transitions.events.add(
            row, "forked", f"into {names}; held still {held * 1000:.0f} ms"
        )
        return attached, held

    # -- stop, delete ------------------------------------------------------------------
    async def stop(self, deployment: Deployment, name: str) -> None:
        """Suspend compute early; a sandbox that runs nothing is left as it is."""
        check_name(name)
        transitions = self._runtime()
        async with self.locks.hold(deployment.id, name):
            row = await self.store.get_sandbox(deployment.id, name)
            if row is None or not row.state.visible:
                raise not_found(name)
            self.nodes.of(row)  # refuses a sandbox whose node is lost
            if row.state is S.RUNNING:
                await self._checked(transitions.suspend(row, "stop"))

    async def network(self, deployment: Deployment, name: str) -> EgressPolicy:
        """The sandbox's egress policy in force."""
        return (await self.get(deployment, name)).options.network or OPEN

    async def egress_audit(
        self, deployment: Deployment, name: str
    ) -> builtins.list[EgressDestination]:
        """Where the sandbox sent lately (docs/network.md, "Audit"): kept in its
        machine's network namespace, which a suspended machine keeps and a
        stopped one has not (none then)."""
        row = await self.get(deployment, name)
        if row.state not in (S.RUNNING, S.SUSPENDED):
            return []
        node = self.nodes.of(row)  # refuses a sandbox whose node is lost
        try:
            return await node.egress_audit(row.class_, row.machine_id)
        except MachineNotFound:
            return []  # gone meanwhile (a stop): nothing runs, nothing to show

    async def set_network(self, deployment: Deployment, name: str, policy: EgressPolicy) -> None:
        """Put ``policy`` in force: recorded (every later start, carry-over and
        move loads it), then swapped into the machine's rules, in force when
        this returns. A machine that failed to take it keeps the record's
        policy for its next start; the caller hears the failure and repeats."""
        check_name(name)
        async with self.locks.hold(deployment.id, name):
            row = await self.store.get_sandbox(deployment.id, name)
            if row is None or not row.state.visible:
                raise not_found(name)
            node = self.nodes.of(row)  # refuses a sandbox whose node is lost
            new = await self.store.replace_sandbox(
                row, replace(row, options=replace(row.options, network=policy))
            )
            if new is None:  # changed meanwhile (a reconcile): the caller repeats
                raise ApiError(
                    ErrorCode.SANDBOX_NETWORK_NOT_APPLIED,
                    f"sandbox {name!r} changed while its network was set; try again",
                    retry_after=1.0,
                )
            try:
                await node.set_egress(row.class_, row.machine_id, policy)
            except DriverError as exc:
                log.warning("sandbox %s: its machine did not take the policy: %s", row.id, exc)
                raise ApiError(
                    ErrorCode.SANDBOX_NETWORK_NOT_APPLIED,
                    f"the policy is recorded but sandbox {name!r} did not take it yet: {exc}",
                    retry_after=1.0,
                ) from None
            await self._runtime().events.add(new, "policy_changed", _policy_reason(policy))

    async def delete(self, deployment: Deployment, name: str) -> None:
        check_name(name)
        transitions = self._runtime()
        async with self.locks.hold(deployment.id, name):
            row = await self.store.get_sandbox(deployment.id, name)
            if row is None:
                raise not_found(name)
            await self.nodes.refresh()
            if not self.nodes.reachable(row):
                # Its node is lost: the record goes; the machine, should the node
                # come back, is an orphan its reconcile destroys.
                await self.store.delete_sandbox(row)
                return
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


def check_fork_names(name: str, new_names: Sequence[str]) -> None:
    """One to MAX_FORK_COPIES new names, none twice, none the source's."""
    if not 1 <= len(new_names) <= MAX_FORK_COPIES:
        raise ApiError(
            ErrorCode.SANDBOX_FORK_INVALID,
            f"a fork makes 1 to {MAX_FORK_COPIES} sandboxes; {len(new_names)} were asked for",
        )
    if len(set(new_names)) != len(new_names):
        raise ApiError(ErrorCode.SANDBOX_FORK_INVALID, "a fork's new names must differ")
    if name in new_names:
        raise _name_taken(name)


def _name_taken(name: str) -> ApiError:
    return ApiError(
        ErrorCode.SANDBOX_NAME_TAKEN,
        f"a sandbox named {name!r} exists already; fork into a new name",
    )


def _policy_reason(policy: EgressPolicy) -> str:
    """The egress policy now in force, as the event log words it."""
    if policy.open:
        return "egress open"
    return "egress " + json.dumps(policy.to_doc(), separators=(",", ":"), sort_keys=True)
