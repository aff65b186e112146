"""How control reports a node that does not answer."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest

from podbay.control.keys import KeyRing
from podbay.control.remote import RemoteNode, _raise_for
from podbay.domain.node import NodeRecord
from podbay.errors import ApiError
from podbay.wire.codes import ErrorCode

pytestmark = pytest.mark.anyio


def _node(tmp_path: Path) -> RemoteNode:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadError("", request=request)

    now = datetime.now(UTC)
    record = NodeRecord(
        name="node-1",
        url="http://node-1.invalid:8700",
        drained=False,
        enrolled_at=now,
        heartbeat_at=now,
    )
    client = httpx.AsyncClient(transport=httpx.MockTransport(refuse))
    return RemoteNode(record, client, KeyRing.open(tmp_path / "keys"))


async def test_a_look_at_a_silent_node_is_a_503_to_ask_again(tmp_path: Path) -> None:
    # A restarting node's first GET failed on a dead connection and the caller
    # saw 500 INTERNAL (test_a_killed_node_is_lost_until_drained, full runs).
    node = _node(tmp_path)
    with pytest.raises(ApiError) as caught:
        await node._call("GET", "/machines")
    assert caught.value.code is ErrorCode.SANDBOXES_UNAVAILABLE
    assert caught.value.retry_after == 1.0
    assert caught.value.status == 503


async def test_a_change_sent_to_a_silent_node_fails_to_start(tmp_path: Path) -> None:
    node = _node(tmp_path)
    with pytest.raises(ApiError) as caught:
        await node._call("POST", "/prepare", {})
    assert caught.value.code is ErrorCode.SANDBOX_START_FAILED


@pytest.mark.parametrize(
    "body",
    [b"<html>bad gateway</html>", b"[]", b'{"error": "x"}', b'{"code": "NO_SUCH_CODE"}'],
)
def test_an_answer_that_is_not_an_error_document_is_internal(body: bytes) -> None:
    # Not JSON, not an object, no code, an unknown code: the status is all we know.
    answer = httpx.Response(502, content=body)
    with pytest.raises(ApiError) as caught:
        _raise_for(answer)
    assert caught.value.code is ErrorCode.INTERNAL
    assert caught.value.message == "the node answered 502"
