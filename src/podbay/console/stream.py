"""``/console/stream``: server-sent events for the console's live views.

``sandboxes``: the deployment's sandboxes (the records ``GET
/api/v1/sandboxes`` answers, plus the node that holds each and the
``template`` it was made from: see :func:`_made_from`), sent at once,
whenever the list changes (looked at every :data:`LOOK_SECONDS`) and at
least every :data:`RESEND_SECONDS`.

``metrics``: ``{"samples": {name: sample}}``, the newest sample of each
running sandbox (:class:`~.latest.LatestSamples`), at once and every sample
period; the page's sparklines need no call of their own. A comment
line keeps the connection from idling out between events. The session is
checked again at every look: a revoked or expired one ends the stream with
an ``error`` event.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import time
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import parse_qs

from podbay.asgi import Receive, Scope, Send
from podbay.control import views
from podbay.domain import Deployment, Sandbox
from podbay.errors import ApiError
from podbay.store.e2b import E2BStore
from podbay.wire.codec import encode

from .guard import Guard
from .latest import LatestSamples
from .static import SECURITY_HEADERS

if TYPE_CHECKING:
    from podbay.control.services.sandboxes import SandboxService

LOOK_SECONDS = 1.0
RESEND_SECONDS = 5.0
PING_SECONDS = 15.0


def event(name: str, document: object) -> bytes:
    # json.dumps escapes newlines, so one data line carries the whole document.
    return f"event: {name}\ndata: {json.dumps(document, default=str)}\n\n".encode()


def _records(
    sandboxes: SandboxService,
    deployment: Deployment,
    rows: list[Sandbox],
    made_from: dict[str, str],
) -> list[Any]:
    return [
        {
            **encode(views.record(row, lost=sandboxes.lost(row))),
            "node": row.node,
            "template": made_from.get(row.name, deployment.name),
        }
        for row in sorted(rows, key=lambda r: r.name)
    ]


async def _made_from(sandboxes: SandboxService, deployment: Deployment) -> dict[str, str]:
    """Sandbox name → what it was made from, where that may not be the
    deployment's own declared environment: the E2B template a sandbox made
    through E2B's API named (:mod:`podbay.e2b.templates`). The others were
    made from the deployment's ``sandbox:`` section, which E2B's API also
    names by the deployment's name."""
    rows = await cast(E2BStore, sandboxes.store).list_e2b_sandboxes(deployment_id=deployment.id)
    return {row.sandbox_id: row.template for row in rows}


async def serve(
    guard: Guard,
    sandboxes: SandboxService,
    latest: LatestSamples,
    scope: Scope,
    receive: Receive,
    send: Send,
) -> None:
    session = await guard.session(scope)
    query = parse_qs((scope.get("query_string") or b"").decode("latin-1"))
    wanted = (query.get("deployment") or [None])[0]
    deployment = await guard.deployment(session, wanted)
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [
                (b"content-type", b"text/event-stream; charset=utf-8"),
                (b"cache-control", b"no-store"),
                *SECURITY_HEADERS,
            ],
        }
    )
    gone = asyncio.ensure_future(_disconnected(receive))
    try:
        await _loop(guard, sandboxes, latest, scope, deployment, send, gone)
    finally:
        gone.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await gone


async def _disconnected(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _loop(
    guard: Guard,
    sandboxes: SandboxService,
    latest: LatestSamples,
    scope: Scope,
    deployment: Deployment,
    send: Send,
    gone: asyncio.Future[None],
) -> None:
    last: list[Any] | None = None
    sent_at = pinged_at = measured_at = -math.inf
    while not gone.done():
        try:
            await guard.session(scope)
        except ApiError as exc:
            await _chunk(send, event("error", exc.body()))
            break
        now = time.monotonic()
        rows = await sandboxes.list(deployment)
        records = _records(sandboxes, deployment, rows, await _made_from(sandboxes, deployment))
        if records != last or now - sent_at >= RESEND_SECONDS:
            await _chunk(send, event("sandboxes", {"sandboxes": records}))
            last, sent_at = records, now
        if now - measured_at >= latest.period:
            samples = await latest.of(rows)
            await _chunk(send, event("metrics", {"samples": encode(samples)}))
            measured_at = now
        if now - pinged_at >= PING_SECONDS:
            await _chunk(send, b": ping\n\n")
            pinged_at = now
        await asyncio.wait({gone}, timeout=LOOK_SECONDS)
    await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _chunk(send: Send, data: bytes) -> None:
    await send({"type": "http.response.body", "body": data, "more_body": True})
