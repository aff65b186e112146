"""Store rows for tests and benchmarks that talk to a store directly.

One builder, so a new field on :class:`~podbay.domain.Sandbox` is given a
value in one place rather than in every test that needs a row.
"""

from __future__ import annotations

from datetime import UTC, datetime

from podbay.domain import Sandbox, SandboxState

#: The moment every built row is stamped with, unless told otherwise.
EPOCH = datetime(2026, 1, 1, tzinfo=UTC)


def sandbox_record(
    name: str,
    *,
    deployment: str = "dep_d",
    account: str = "acct",
    state: SandboxState = SandboxState.CREATING,
    node: str = "local",
    class_: str = "container",
    at: datetime = EPOCH,
) -> Sandbox:
    """A sandbox row named ``name`` in ``deployment``, as the store keeps it.

    Its id and machine id are derived from the deployment and name, so rows of
    different deployments never clash. A row that is not ``creating`` is taken
    to have started at ``at``.
    """
    return Sandbox(
        id=f"sb-{deployment}-{name}",
        deployment_id=deployment,
        account=account,
        name=name,
        class_=class_,
        state=state,
        machine_id=f"m-{deployment}-{name}".replace("_", "-"),
        created_at=at,
        last_active_at=at,
        started_at=None if state is SandboxState.CREATING else at,
        ceiling_at=None,
        node=node,
    )
