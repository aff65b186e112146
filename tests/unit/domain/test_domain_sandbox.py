from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from podbay.domain import TRANSITIONS, Sandbox, SandboxState, can_transition
from podbay.domain.sandbox import new_machine_id
from podbay.runtime.base import check_machine_id

S = SandboxState
T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _row(state: SandboxState) -> Sandbox:
    return Sandbox(
        id="sb-1",
        deployment_id="d",
        account="a",
        name="n",
        class_="default",
        state=state,
        machine_id="m-1",
        created_at=T0,
        last_active_at=T0,
        started_at=None,
        ceiling_at=None,
    )


def test_every_state_has_a_way_out_but_deleting():
    for state in S:
        assert bool(TRANSITIONS[state]) is (state is not S.DELETING)
        if state is not S.DELETING:
            assert can_transition(state, S.DELETING)


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (S.STOPPED, S.SUSPENDED),
        (S.CREATING, S.STOPPED),
        (S.DELETING, S.RUNNING),
        (S.RUNNING, S.CREATING),
    ],
)
def test_illegal_moves_refused(old, new):
    with pytest.raises(ValueError, match="is not a transition"):
        _row(old).moved(new)


def test_started_is_a_new_incarnation_with_a_ceiling():
    row = _row(S.STOPPED)
    now = T0 + timedelta(hours=9)
    started = row.started(now, timedelta(hours=8))
    assert started.state is S.RUNNING
    assert started.incarnation == row.incarnation + 1
    assert started.ceiling_at == now + timedelta(hours=8)
    assert started.last_active_at == now


def test_deleting_is_invisible():
    assert not S.DELETING.visible
    assert all(s.visible for s in S if s is not S.DELETING)


def test_machine_ids_fit_the_driver():
    for _ in range(50):
        check_machine_id(new_machine_id())
