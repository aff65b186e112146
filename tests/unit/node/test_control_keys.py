"""A node's copy of the control plane's public keys (``ControlKeys``)."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from podbay.dataplane import nodeapi
from podbay.node.server import ControlKeys


def _doc(*kids: str) -> dict[str, Any]:
    return {
        "keys": [
            {
                "kid": kid,
                "public": nodeapi.public_key_text(Ed25519PrivateKey.generate().public_key()),
            }
            for kid in kids
        ]
    }


def _answering(doc: dict[str, Any], calls: list[str]) -> Any:
    def get(url: str, **_: Any) -> httpx.Response:
        calls.append(url)
        return httpx.Response(200, json=doc, request=httpx.Request("GET", url))

    return get


def test_a_new_kid_during_a_fetch_under_way_fetches_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A heartbeat's fetch that left before a rotation is still under way when
    a credential signed with the new key arrives: the node asks again rather
    than refusing it as "fetched a moment ago"."""
    keys = ControlKeys("http://control.invalid", "node-credential")
    keys._apply(_doc("k1"))
    keys._fetched_at = 0.0
    sync_fetches: list[str] = []
    monkeypatch.setattr(httpx, "get", _answering(_doc("k1", "k2"), sync_fetches))

    async def scenario() -> None:
        answered = asyncio.Event()

        async def slow(request: httpx.Request) -> httpx.Response:
            await answered.wait()
            return httpx.Response(200, json=_doc("k1"))  # as read before the rotation

        async with httpx.AsyncClient(transport=httpx.MockTransport(slow)) as client:
            heartbeat_fetch = asyncio.create_task(keys.fetch(client))
            await asyncio.sleep(0)  # the fetch is under way
            await asyncio.sleep(0)
            assert keys.public_key("k2") is not None
            answered.set()
            await heartbeat_fetch

    asyncio.run(scenario())
    assert len(sync_fetches) == 1


def test_unknown_kids_fetch_at_most_once_a_second(monkeypatch: pytest.MonkeyPatch) -> None:
    """A forged kid costs one fetch, not one per request."""
    keys = ControlKeys("http://control.invalid", "node-credential")
    keys._apply(_doc("k1"))
    fetches: list[str] = []
    monkeypatch.setattr(httpx, "get", _answering(_doc("k1"), fetches))
    keys._fetched_at = 0.0
    for _ in range(5):
        assert keys.public_key("forged") is None
    assert len(fetches) == 1
