"""A sandbox's slots at its agent (gateway.admission): in order, bounded, and
streamed bodies never take them all."""

from __future__ import annotations

import asyncio

import pytest

from podbay.dataplane.admission import Admission
from podbay.errors import ApiError
from podbay.wire.codes import ErrorCode


def test_waiters_get_slots_in_order_and_one_past_the_queue_is_refused() -> None:
    async def main() -> None:
        admission = Admission(limit=2, queue=2)
        for _ in range(2):
            await admission.acquire(streams=False)
        order: list[int] = []

        async def waiter(n: int) -> None:
            await admission.acquire(streams=False)
            order.append(n)

        waiters = [asyncio.create_task(waiter(n)) for n in range(2)]
        await asyncio.sleep(0)  # one turn: each waiter runs up to its wait
        assert admission.waiting == 2
        with pytest.raises(ApiError) as refused:
            await admission.acquire(streams=False)
        assert refused.value.code is ErrorCode.SANDBOX_BUSY
        assert refused.value.retry_after is not None
        admission.release(streams=False)
        admission.release(streams=False)
        await asyncio.gather(*waiters)
        assert order == [0, 1]
        assert admission.waiting == 0

    asyncio.run(main())


def test_streamed_bodies_take_at_most_half_the_slots() -> None:
    async def main() -> None:
        admission = Admission(limit=4, queue=0)
        for _ in range(2):
            await admission.acquire(streams=True)
        with pytest.raises(ApiError):
            await admission.acquire(streams=True)  # the streams' half is full
        for _ in range(2):
            await admission.acquire(streams=False)  # the other half is there
        with pytest.raises(ApiError):
            await admission.acquire(streams=False)
        admission.release(streams=True)
        await admission.acquire(streams=False)  # a stream's slot, freed, serves anyone

    asyncio.run(main())


def test_websockets_have_their_own_cap_and_no_queue() -> None:
    async def main() -> None:
        admission = Admission(limit=1, queue=0, websockets=2)
        admission.open_websocket()
        admission.open_websocket()
        with pytest.raises(ApiError) as refused:
            admission.open_websocket()  # refused at once: no queue
        assert refused.value.code is ErrorCode.SANDBOX_BUSY
        assert refused.value.retry_after is not None
        await admission.acquire(streams=False)  # WebSockets hold no request slot
        admission.close_websocket()
        admission.open_websocket()

    asyncio.run(main())
