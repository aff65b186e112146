"""A create whose environment is still building (podbay.e2b.service.attach)
is held a while, then refused in the shape E2B's SDK retries by itself."""

from __future__ import annotations

import json
from typing import Any, cast

import pytest
from starlette.requests import Request

from podbay.dataplane.environment_seam import Building
from podbay.domain import Deployment
from podbay.e2b import error_responses, service
from podbay.e2b.service import E2BService
from podbay.wire.control import BuildStep

pytestmark = pytest.mark.anyio


class StillBuilding:
    """A sandbox service whose environment never finishes building."""

    def __init__(self) -> None:
        self.asked = 0

    async def attach(self, *_: Any) -> Building:
        self.asked += 1
        progress = BuildStep(step=2, steps=3, doing="pip install", elapsed_seconds=1.0)
        return Building(retry_after_seconds=1, done=None, progress=progress)


async def test_a_build_past_the_hold_is_a_503_the_sdk_retries(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(service, "BUILD_HOLD_SECONDS", 0.05)
    sandboxes = StillBuilding()
    e2b = E2BService(cast(Any, object()), cast(Any, sandboxes))
    with pytest.raises(error_responses.E2BError) as refused:
        await e2b.attach(cast(Deployment, object()), "abcdefghij0123456789")
    exc = refused.value
    assert (exc.status, exc.code, exc.retry_after) == (503, "E2B_TEMPLATE_BUILDING", 1)
    assert "step 2 of 3: pip install" in exc.message
    assert sandboxes.asked >= 1
    answer = await error_responses.on_e2b_error(cast(Request, None), exc)
    assert answer.status_code == 503
    assert (answer.headers["should-retry"], answer.headers["retry-after"]) == ("true", "1")
    assert json.loads(bytes(answer.body))["code"] == 503
    await e2b.close()
