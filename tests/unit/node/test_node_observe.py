"""The node's metrics sampler with a fake driver reading (the real readings
are tests/integration/platform/test_platform_observe.py's)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from podbay.node.observe import Sampler
from podbay.runtime.usage import Usage

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Clock:
    def __init__(self) -> None:
        self.now = datetime(2026, 1, 1, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now


def usage(cpu: float, memory: int) -> Usage:
    return Usage(
        cpu_seconds=cpu,
        memory_bytes=memory,
        memory_limit_bytes=1 << 30,
        disk_bytes=1,
        net_rx_bytes=2,
        net_tx_bytes=3,
    )


async def test_samples_start_after_one_period_age_out_and_go_with_the_machine():
    readings: dict[str, Usage | None] = {"m1": usage(1.0, 100)}
    asked: list[tuple[str, str]] = []

    async def measure(class_: str, machine_id: str) -> Usage | None:
        asked.append((class_, machine_id))
        return readings[machine_id]

    clock = Clock()
    sampler = Sampler(measure, window=timedelta(seconds=10), clock=clock, background=False)
    sampler.watch("sbx_1", "gvisor", "m1")
    await sampler.sample_once()
    assert sampler.samples("sbx_1") == []  # CPU needs a period: the first reading starts one
    readings["m1"] = usage(1.5, 300)
    clock.now += timedelta(seconds=2)
    await sampler.sample_once()
    (first,) = sampler.samples("sbx_1")
    assert first.memory_bytes == 300
    assert first.cpu_percent > 0
    assert first.at == clock.now
    assert asked == [("gvisor", "m1"), ("gvisor", "m1")]

    sampler.unwatch("sbx_1")  # suspended: no more readings, the past stays readable
    await sampler.sample_once()
    assert len(asked) == 2
    assert sampler.samples("sbx_1") == [first]
    assert sampler.samples("sbx_1", since=first.at) == []

    clock.now += timedelta(seconds=11)
    await sampler.sample_once()
    assert sampler.samples("sbx_1") == []  # older than the window

    sampler.watch("sbx_2", "container", "m2")
    readings["m2"] = None  # not running: nothing recorded, nothing raised
    await sampler.sample_once()
    assert sampler.samples("sbx_2") == []
    sampler.forget_machine("m2")
    assert sampler.samples("sbx_2") == []


async def test_oom_kills_count_from_the_first_reading_and_across_a_new_boot():
    from podbay.dataplane.oom import OomTally

    counter = {"kills": 3}

    async def measure(class_: str, machine_id: str) -> Usage | None:
        return Usage(
            cpu_seconds=1.0,
            memory_bytes=1,
            memory_limit_bytes=2,
            disk_bytes=0,
            net_rx_bytes=0,
            net_tx_bytes=0,
            oom_kills=counter["kills"],
        )

    sampler = Sampler(measure, clock=Clock(), background=False)
    tally = OomTally()
    sampler.watch("sbx_1", "container", "m1")
    await sampler.sample_once()
    assert tally.new(sampler.oom_kills()) == {}  # kills before the first reading are not new
    counter["kills"] = 5
    await sampler.sample_once()
    assert [n for _, n in tally.new(sampler.oom_kills()).values()] == [2]
    assert tally.new(sampler.oom_kills()) == {}  # said once
    counter["kills"] = 1  # a new boot's counter
    await sampler.sample_once()
    assert [n for _, n in tally.new(sampler.oom_kills()).values()] == [1]


async def test_one_machine_that_fails_to_answer_costs_no_other_its_sample():
    async def measure(class_: str, machine_id: str) -> Usage | None:
        if machine_id == "bad":
            raise OSError("gone")
        return usage(1.0, 7)

    sampler = Sampler(measure, clock=Clock(), background=False)
    sampler.watch("sbx_bad", "vm", "bad")
    sampler.watch("sbx_good", "container", "good")
    await sampler.sample_once()
    await sampler.sample_once()
    assert sampler.samples("sbx_bad") == []
    assert [s.memory_bytes for s in sampler.samples("sbx_good")] == [7]
