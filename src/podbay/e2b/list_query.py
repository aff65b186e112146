"""``GET /v2/sandboxes``'s filters beyond metadata and state, as E2B's API
defines them: ``template`` (the template id a sandbox was created with),
``startedAfter`` (an ISO 8601 time: sandboxes started then or later) and
``order`` (by start time, ``desc``, newest first, unless ``asc``). E2B's JS
SDK sends all three from ``Sandbox.list({query, order})``, the Python SDK
from ``SandboxQuery`` and ``order=``; ignoring them would answer a filtered
list with every sandbox."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from starlette.datastructures import QueryParams

from podbay.store.e2b import E2BSandbox

from .error_responses import E2BError


@dataclass(frozen=True)
class ListQuery:
    template: str | None = None
    started_after: datetime | None = None
    newest_first: bool = True

    def admits(self, row: E2BSandbox) -> bool:
        if self.template is not None and row.template != self.template:
            return False
        return self.started_after is None or row.started_at >= self.started_after


def list_query(params: QueryParams) -> ListQuery:
    """The filters of a list request; a value E2B's API would refuse is 400."""
    order = params.get("order", "desc")
    if order not in ("asc", "desc"):
        raise E2BError(400, "REQUEST_INVALID", "order is asc or desc")
    return ListQuery(
        template=params.get("template") or None,
        started_after=_started_after(params.get("startedAfter")),
        newest_first=order == "desc",
    )


def _started_after(raw: str | None) -> datetime | None:
    if not raw:
        return None
    try:
        value = datetime.fromisoformat(raw)
    except ValueError:
        raise E2BError(
            400, "REQUEST_INVALID", f"startedAfter {raw[:64]!r} is no ISO 8601 time"
        ) from None
    # A time without a zone is UTC, as the API's other times are.
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)
