"""Attach's options, checked: labels, variables, CPU, memory, idle timeout.

Everything here is the caller's input: a label or variable that cannot be
one, or a figure outside the operator's bounds (``runtime.min_cpus`` ...
``lifecycle.max_idle_seconds``), is refused before anything is made, with a
code naming what is wrong (``SANDBOX_MEMORY_ABOVE_MAX``).

Options apply when the sandbox is created. A later attach that names an
option the sandbox was not created with is 409 ``SANDBOX_OPTIONS_CONFLICT``
(the same rule as its class): the owner learns the sandbox is not what it
asked for instead of getting it silently; one that names none, or the same
ones, attaches as before.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import replace
from datetime import UTC, datetime

from podbay.domain import Deployment, Sandbox, SandboxOptions
from podbay.domain.egress import OPEN, EgressDestination, EgressPolicy
from podbay.errors import ApiError
from podbay.settings import Settings
from podbay.wire.codes import ErrorCode
from podbay.wire.control import AttachRequest, NetworkPolicy
from podbay.wire.control import EgressDestination as WireEgressDestination

from .volumes import mounts_of

MAX_LABELS = 32
_LABEL_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,62}")
MAX_LABEL_VALUE = 256
MAX_ENV = 128
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,255}")
#: Names, values, ``=`` and NULs of every variable together (an ``execve``
#: takes far more; this keeps the record and the env file small).
MAX_ENV_BYTES = 32 * 1024
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
MIB = 1024 * 1024


def check_label(key: str, value: str) -> None:
    if not _LABEL_KEY.fullmatch(key):
        raise ApiError(
            ErrorCode.SANDBOX_LABELS_INVALID,
            f"label key {key[:80]!r} must match ^[A-Za-z0-9][A-Za-z0-9._/-]{{0,62}}$",
        )
    if len(value) > MAX_LABEL_VALUE or _CONTROL.search(value):
        raise ApiError(
            ErrorCode.SANDBOX_LABELS_INVALID,
            f"label {key!r}: values are at most {MAX_LABEL_VALUE} characters, "
            "without control characters",
        )


def check_labels(labels: Mapping[str, str]) -> None:
    if len(labels) > MAX_LABELS:
        raise ApiError(ErrorCode.SANDBOX_LABELS_INVALID, f"at most {MAX_LABELS} labels")
    for key, value in labels.items():
        check_label(key, value)


def check_env(env: Mapping[str, str]) -> None:
    if len(env) > MAX_ENV:
        raise ApiError(ErrorCode.SANDBOX_ENV_INVALID, f"at most {MAX_ENV} variables")
    size = 0
    for name, value in env.items():
        if not _ENV_NAME.fullmatch(name):
            raise ApiError(
                ErrorCode.SANDBOX_ENV_INVALID,
                f"variable name {name[:80]!r} must match ^[A-Za-z_][A-Za-z0-9_]*$",
            )
        if "\x00" in value:
            raise ApiError(
                ErrorCode.SANDBOX_ENV_INVALID, f"variable {name!r} contains a NUL character"
            )
        size += len(name.encode()) + len(value.encode()) + 2
    if size > MAX_ENV_BYTES:
        raise ApiError(
            ErrorCode.SANDBOX_ENV_INVALID,
            f"the variables are {size} bytes together; at most {MAX_ENV_BYTES}",
        )


def _bounded(
    value: float, low: float, high: float, what: str, unit: str, codes: tuple[ErrorCode, ErrorCode]
) -> None:
    if value < low:
        raise ApiError(codes[0], f"{what} {value:g}{unit} is below this server's minimum {low:g}")
    if value > high:
        raise ApiError(codes[1], f"{what} {value:g}{unit} is above this server's maximum {high:g}")


def options_of(body: AttachRequest, settings: Settings) -> SandboxOptions:
    """The options ``body`` asks for, checked against ``settings``' bounds."""
    labels = dict(body.labels or {})
    env = dict(body.env or {})
    check_labels(labels)
    check_env(env)
    rt, life = settings.runtime, settings.lifecycle
    if body.cpus is not None:
        if not math.isfinite(body.cpus):
            raise ApiError(ErrorCode.REQUEST_INVALID, "cpus must be a finite number")
        _bounded(
            body.cpus,
            rt.min_cpus,
            rt.max_cpus,
            "cpus",
            "",
            (ErrorCode.SANDBOX_CPUS_BELOW_MIN, ErrorCode.SANDBOX_CPUS_ABOVE_MAX),
        )
    if body.memory_mib is not None:
        _bounded(
            body.memory_mib,
            rt.min_memory_bytes / MIB,
            rt.max_memory_bytes / MIB,
            "memory_mib",
            " MiB",
            (ErrorCode.SANDBOX_MEMORY_BELOW_MIN, ErrorCode.SANDBOX_MEMORY_ABOVE_MAX),
        )
    if body.idle_timeout_seconds is not None:
        _bounded(
            body.idle_timeout_seconds,
            life.min_idle_seconds,
            life.max_idle_seconds,
            "idle_timeout_seconds",
            " s",
            (ErrorCode.SANDBOX_IDLE_TIMEOUT_BELOW_MIN, ErrorCode.SANDBOX_IDLE_TIMEOUT_ABOVE_MAX),
        )
    return SandboxOptions(
        labels=labels,
        env=env,
        cpus=body.cpus,
        memory_mib=body.memory_mib,
        idle_timeout_seconds=body.idle_timeout_seconds,
        network=None if body.network is None else egress_of(body.network),
        volumes=mounts_of(body.volumes) if body.volumes else (),
    )


def egress_of(body: NetworkPolicy) -> EgressPolicy:
    """The policy of a ``network`` object, checked (a bad entry names itself)."""
    doc: dict[str, object] = {"internet": body.internet}
    if body.allow is not None:
        doc["allow"] = body.allow
    if body.deny is not None:
        doc["deny"] = body.deny
    return EgressPolicy.parse(doc)


def egress_row(row: EgressDestination) -> WireEgressDestination:
    """One audit row as the wire has it."""
    return WireEgressDestination(
        address=row.address,
        port=row.port,
        protocol=row.protocol,
        name=row.name,
        verdict="reached" if row.verdict == "reached" else "refused",
        packets=row.packets,
        bytes=row.bytes,
        last_seen=datetime.fromtimestamp(row.last_seen, UTC),
    )


def network_doc(policy: EgressPolicy) -> NetworkPolicy:
    doc = policy.to_doc()
    return NetworkPolicy(
        internet=doc.get("internet", True), allow=doc.get("allow"), deny=doc.get("deny")
    )


def with_default_network(options: SandboxOptions, deployment: Deployment) -> SandboxOptions:
    """``options`` for a new sandbox: the sandbox section's ``network`` (checked
    when the deployment was registered) when attach named none."""
    if options.network is not None:
        return options
    section = deployment.sandbox_section or {}
    raw = section.get("network") if isinstance(section, dict) else None
    try:
        network = OPEN if raw is None else EgressPolicy.parse(raw)
    except ApiError as exc:
        # Registered before egress policies existed, or edited by hand.
        raise ApiError(
            ErrorCode.SANDBOX_PREPARE_FAILED, f"the sandbox section's network: {exc.message}"
        ) from None
    return replace(options, network=network)


def check_same(row: Sandbox, asked: SandboxOptions) -> None:
    """Refuse (409) options an existing sandbox was not created with; options
    not named (empty, None) are not compared."""
    have = row.options
    if asked.network is not None and asked.network != (have.network or OPEN):
        raise ApiError(
            ErrorCode.SANDBOX_OPTIONS_CONFLICT,
            f"sandbox {row.name!r} exists with another network policy than asked: "
            "change it with PUT /api/v1/sandboxes/{name}/network, or attach without it",
        )
    if asked.volumes and asked.volumes != have.volumes:
        raise ApiError(
            ErrorCode.SANDBOX_OPTIONS_CONFLICT,
            f"sandbox {row.name!r} exists with other volumes than asked; volumes are "
            "mounted when a sandbox is created: attach without them, or delete it first",
        )
    for field in ("labels", "env", "cpus", "memory_mib", "idle_timeout_seconds"):
        wanted = getattr(asked, field)
        if wanted in (None, {}):
            continue
        current = getattr(have, field)
        if (dict(current) if isinstance(current, Mapping) else current) != (
            dict(wanted) if isinstance(wanted, Mapping) else wanted
        ):
            raise ApiError(
                ErrorCode.SANDBOX_OPTIONS_CONFLICT,
                f"sandbox {row.name!r} exists with other {field} than asked; options apply "
                "when a sandbox is created: attach without them, or delete it first",
            )


def label_filter(pairs: Iterable[str]) -> dict[str, str]:
    """``list``'s ``label=k=v`` query values as one mapping (all must match)."""
    wanted: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise ApiError(
                ErrorCode.SANDBOX_LABELS_INVALID, f"label filter {pair[:80]!r} is not k=v"
            )
        check_label(key, value)
        wanted[key] = value
    return wanted
