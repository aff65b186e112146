"""How a store row maps to the domain's records, shared by every SQL store.

Both stores keep times as unix seconds (``REAL`` / ``DOUBLE PRECISION``) and
select the columns in the order below, so one mapping serves both.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from podbay.domain import Deployment, Sandbox, SandboxOptions, SandboxState

SANDBOX_COLUMNS = (
    "id, deployment_id, account, name, class, state, machine_id, created_at,"
    " last_active_at, started_at, ceiling_at, incarnation, version, suspended_at, node, routed_on,"
    " asked_class, options"
)
DEPLOYMENT_COLUMNS = "id, name, account, spec_text, sandbox_section, created_at, updated_at"

#: One row as the drivers give it: each column's type is the schema's.
Row = Sequence[Any]


def ts(value: datetime | None) -> float | None:
    return None if value is None else value.timestamp()


def at(value: float) -> datetime:
    return datetime.fromtimestamp(value, UTC)


def dt(value: float | None) -> datetime | None:
    return None if value is None else at(value)


# sandbox() and deployment() are alike in shape on purpose: each spells out
# one record's columns in SANDBOX_COLUMNS / DEPLOYMENT_COLUMNS order, so a
# reader checks a field against its column at a glance.
def sandbox(row: Row) -> Sandbox:
    return Sandbox(
        id=row[0],
        deployment_id=row[1],
        account=row[2],
        name=row[3],
        class_=row[4],
        state=SandboxState(row[5]),
        machine_id=row[6],
        created_at=at(row[7]),
        last_active_at=at(row[8]),
        started_at=dt(row[9]),
        ceiling_at=dt(row[10]),
        incarnation=row[11],
        version=row[12],
        suspended_at=dt(row[13]),
        node=row[14],
        routed_on=row[15],
        asked_class=row[16],
        options=SandboxOptions.from_json(row[17]),
    )


# Alike in shape to sandbox() above on purpose: one record, column by column.
def deployment(row: Row) -> Deployment:
    return Deployment(
        id=row[0],
        name=row[1],
        account=row[2],
        spec_text=row[3],
        sandbox_section=None if row[4] is None else json.loads(row[4]),
        created_at=at(row[5]),
        updated_at=at(row[6]),
    )


def sandbox_values(s: Sandbox) -> tuple[object, ...]:
    return (
        s.id,
        s.deployment_id,
        s.account,
        s.name,
        s.class_,
        s.state.value,
        s.machine_id,
        ts(s.created_at),
        ts(s.last_active_at),
        ts(s.started_at),
        ts(s.ceiling_at),
        s.incarnation,
        ts(s.suspended_at),
        s.node,
        s.asked_class,
        s.options.to_json(),
    )
