"""``GET /v2/sandboxes``'s ``template``, ``startedAfter`` and ``order``
(podbay.e2b.list_query): what each admits, E2B's default order, and a bad value
a 400 in E2B's shape."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from starlette.datastructures import QueryParams

from podbay.e2b.list_query import ListQuery, list_query
from podbay.errors import E2BError
from podbay.store.e2b import E2BSandbox

NOON = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)


def row(template: str = "base", started_at: datetime = NOON) -> E2BSandbox:
    return E2BSandbox(
        sandbox_id="s",
        deployment_id="d",
        template=template,
        metadata={},
        env_vars={},
        started_at=started_at,
        end_at=started_at,
    )


def test_nothing_asked_admits_all_newest_first() -> None:
    query = list_query(QueryParams(""))
    assert query == ListQuery(template=None, started_after=None, newest_first=True)
    assert query.admits(row())


def test_template_order_and_started_after() -> None:
    query = list_query(QueryParams("template=base&order=asc&startedAfter=2026-12-02T12:00:00.000Z"))
    assert query.newest_first is False
    assert query.admits(row())  # started at that very time: "at or after"
    assert not query.admits(row(template="other"))
    assert not query.admits(row(started_at=NOON.replace(minute=0, second=0, hour=11)))


def test_a_time_without_a_zone_is_utc() -> None:
    query = list_query(QueryParams("startedAfter=2026-12-02T12:00:01"))
    assert query.started_after == NOON.replace(second=1)
    assert not query.admits(row())


@pytest.mark.parametrize(
    "raw", ["order=sideways", "order=", "startedAfter=yesterday", "startedAfter=2026-13-01"]
)
def test_bad_values_are_400(raw: str) -> None:
    with pytest.raises(E2BError) as refused:
        list_query(QueryParams(raw))
    assert (refused.value.status, refused.value.code) == (400, "REQUEST_INVALID")
