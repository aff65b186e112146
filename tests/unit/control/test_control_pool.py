"""The warm pool over the fake driver."""

from __future__ import annotations

import asyncio

import pytest

from podbay.dataplane.environment_seam import Prepared
from podbay.dataplane.nodeapi import POOL_LABEL
from podbay.node.pool import WARM_UP_EXECS, WarmPool
from podbay.runtime.base import Limits
from podbay.testing.fake_driver import FakeDriver

pytestmark = pytest.mark.anyio
LIMITS = Limits(memory_bytes=1, cpus=1, pids=1, disk_bytes=1)


@pytest.fixture
async def driver(tmp_path):
    d = FakeDriver(tmp_path)
    yield d
    await d.close_all()


async def test_fill_take_refill(driver):
    pool = WarmPool(driver, LIMITS, 2)
    plain = Prepared()
    pool.refill(plain)
    await pool.wait_filled()
    assert len(pool) == 2
    assert len(driver.running()) == 2
    assert all(m.labels[POOL_LABEL] == "plain" for m in driver.machines.values())
    taken = pool.take(plain)
    assert taken in driver.machines
    await pool.wait_filled()
    assert len(pool) == 2
    assert len(driver.machines) == 3
    await pool.close()
    assert list(driver.machines) == [taken]  # ready ones destroyed, the taken one kept


async def test_first_take_of_an_environment_misses_then_fills(driver):
    pool = WarmPool(driver, LIMITS, 1)
    env = Prepared(key="abc", env={"X": "1"})
    assert pool.take(env) is None
    await pool.wait_filled()
    (machine,) = driver.machines.values()
    assert dict(machine.spec.env) == {"X": "1"}
    assert machine.labels[POOL_LABEL] == "abc"
    assert pool.take(env) == machine.spec.machine_id
    await pool.close()


async def test_least_recently_used_environments_are_evicted(driver):
    pool = WarmPool(driver, LIMITS, 1, max_keys=2)
    pool.refill(Prepared())
    await pool.wait_filled()
    for key in ("a", "b", "c"):
        pool.take(Prepared(key=key))
        await pool.wait_filled()
    await pool.close(destroy=False)
    for task in list(pool._destroying):
        await task
    labels = sorted(m.labels[POOL_LABEL] for m in driver.machines.values())
    assert labels == ["c", "plain"]


async def test_give_back(driver):
    pool = WarmPool(driver, LIMITS, 1)
    plain = Prepared()
    pool.refill(plain)
    await pool.wait_filled()
    taken = pool.take(plain)
    pool.give_back(plain, taken)
    assert pool.take(plain) == taken
    await pool.close()


async def test_a_pooled_machine_has_run_commands_before_it_is_handed_out(driver):
    # A fresh agent's first execs are slower than later ones: the pool pays
    # for them, several on one connection (one left the owner's first slow).
    pool = WarmPool(driver, LIMITS, 2)
    pool.refill(Prepared(), delay=0.0)
    await pool.wait_filled()
    for machine in driver.machines.values():
        assert machine.requests == [("CONNECT", "")] + [("POST", "/v1/exec")] * WARM_UP_EXECS
    assert WARM_UP_EXECS > 1
    await pool.close()


async def test_the_refill_waits_until_the_hand_out_is_done(driver):
    pool = WarmPool(driver, LIMITS, 1)
    pool.refill(Prepared(), delay=0.0)
    await pool.wait_filled()
    driver.calls.clear()
    pool.take(Prepared())
    await asyncio.sleep(0.05)
    assert driver.calls == []  # nothing started while the taker is still being served
    await pool.wait_filled()
    assert [call for call, _ in driver.calls] == ["create", "start"]
    await pool.close()


async def test_a_hand_out_during_a_refill_also_gets_its_quiet_moment(driver):
    # Takes closer together than a machine's start: the refill under way must
    # not start the next machine while the second taker is being served.
    pool = WarmPool(driver, LIMITS, 2)
    pool.refill(Prepared(), delay=0.0)
    await pool.wait_filled()
    pool.refill_delay = 1.0
    driver.start_delay = 0.2
    driver.calls.clear()
    pool.take(Prepared())  # t=0: the refill starts a machine at t=1.0, ready ~1.2
    await asyncio.sleep(1.1)
    assert [call for call, _ in driver.calls] == ["create", "start"]
    pool.take(Prepared())  # t=1.1, while that machine starts
    await asyncio.sleep(0.7)  # t=1.8: the first is ready; the second waits for t=2.1
    assert [call for call, _ in driver.calls if call == "create"] == ["create"]
    await pool.wait_filled()
    assert len(pool) == 2
    await pool.close()
