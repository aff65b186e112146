"""Domain records as wire models: the one place the two meet."""

from __future__ import annotations

from typing import Any

from podbay.domain import Sandbox, SandboxOptions, SandboxState
from podbay.wire.control import SandboxHandle, SandboxRecord, SandboxStateName
from podbay.wire.paths import CREDENTIAL_HEADER

from .services.sandboxes import Attached
from .services.volumes import wire_mounts

#: Each state's wire name; ``deleting`` has none (a deleting sandbox is gone to callers).
_SHOWN: dict[SandboxState, SandboxStateName] = {
    SandboxState.CREATING: "creating",
    SandboxState.RUNNING: "running",
    SandboxState.SUSPENDED: "suspended",
    SandboxState.STOPPED: "stopped",
}


def record(sandbox: Sandbox, *, lost: bool = False) -> SandboxRecord:
    """What ``GET`` shows; services never hand over ``deleting`` rows. ``lost``:
    the node holding it stopped answering (split roles)."""
    return SandboxRecord(
        name=sandbox.name,
        class_=sandbox.asked_class,
        runtime_class=sandbox.class_,
        state="lost" if lost else _SHOWN[sandbox.state],
        created_at=sandbox.created_at,
        last_active_at=sandbox.last_active_at,
        ceiling_at=sandbox.ceiling_at if sandbox.state.value in ("running", "suspended") else None,
        **options(sandbox.options),
    )


def options(o: SandboxOptions) -> dict[str, Any]:
    """The options a record and a handle show: those set, each absent otherwise."""
    return {
        "labels": dict(o.labels) or None,
        "env": dict(o.env) or None,
        "cpus": o.cpus,
        "memory_mib": o.memory_mib,
        "idle_timeout_seconds": o.idle_timeout_seconds,
        "volumes": wire_mounts(o.volumes),
    }


def handle(attached: Attached, asked: str) -> SandboxHandle:
    """Attach's 200; ``class`` is this attach's word (``asked``), whatever the
    sandbox was made with, as the reference client expects of a handle."""
    s = attached.sandbox
    return SandboxHandle(
        name=s.name,
        class_=asked,
        runtime_class=s.class_,
        state="running",
        created_at=s.created_at,
        last_active_at=s.last_active_at,
        ceiling_at=s.ceiling_at,
        endpoint=attached.endpoint,
        headers={CREDENTIAL_HEADER: attached.credential},
        expires_at=attached.expires_at,
        start=attached.start,
        **options(s.options),
    )
