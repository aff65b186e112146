"""Benchmark the two stores side by side: SQLite file and PostgreSQL (own cluster).

    .venv/bin/python bench/store.py [-n 300] [--racers 50]

For each store, in the same run:

* p50 / p95 of the calls an attach makes (``get_sandbox``, ``insert_sandbox``,
  ``replace_sandbox``), one at a time on one instance;
* a race: ``--racers`` concurrent first inserts of one new name through two
  store instances (as two replicas would): rows made, must be exactly 1;
* a compare-and-set race: ``--racers`` writers holding one version on two
  instances: writers that won, must be exactly 1.

PostgreSQL is a temporary cluster on a unix socket with fsync off (as the
tests run it), so its figures are the round trip and the locking, not disk.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from podbay.domain import Sandbox
from podbay.store.base import InsertOutcome, Store
from podbay.store.postgres import PostgresStore
from podbay.store.sqlite import SqliteStore
from podbay.testing.postgres import TemporaryCluster
from podbay.testing.records import sandbox_record

T0 = datetime(2026, 1, 1, tzinfo=UTC)


def sandbox(name: str, dep: str = "dep_bench") -> Sandbox:
    return sandbox_record(name, deployment=dep, at=T0)


async def timed(n: int, call: Callable[[int], Awaitable[object]]) -> dict[str, float]:
    samples = []
    for i in range(n):
        start = time.perf_counter()
        await call(i)
        samples.append((time.perf_counter() - start) * 1000)
    samples.sort()
    return {
        "p50_ms": round(statistics.median(samples), 3),
        "p95_ms": round(samples[int(len(samples) * 0.95) - 1], 3),
    }


async def measure(open_one: Callable[[], Store], n: int, racers: int) -> dict[str, object]:
    first, second = open_one(), open_one()
    try:
        out: dict[str, object] = {}
        out["insert"] = await timed(
            n,
            lambda i: first.insert_sandbox(
                sandbox(f"s{i}"), deployment_cap=10**6, account_cap=10**6
            ),
        )
        out["get"] = await timed(n, lambda i: first.get_sandbox("dep_bench", f"s{i}"))
        rows = [await first.get_sandbox("dep_bench", f"s{i}") for i in range(n)]

        async def start(i: int) -> None:
            row = rows[i]
            assert row is not None
            await first.replace_sandbox(row, row.started(T0, timedelta(hours=8)))

        out["replace"] = await timed(n, start)

        outcomes = await asyncio.gather(
            *(
                (first if i % 2 else second).insert_sandbox(
                    replace(sandbox("raced", dep="dep_race"), id=f"sb-r{i}", machine_id=f"m-r{i}"),
                    deployment_cap=10**6,
                    account_cap=10**6,
                )
                for i in range(racers)
            )
        )
        out["name_race_rows"] = outcomes.count(InsertOutcome.INSERTED)
        row = await first.get_sandbox("dep_race", "raced")
        assert row is not None
        won = await asyncio.gather(
            *(
                (first if i % 2 else second).replace_sandbox(
                    row, row.started(T0, timedelta(hours=i + 1))
                )
                for i in range(racers)
            )
        )
        out["cas_race_winners"] = sum(1 for w in won if w is not None)
        return out
    finally:
        await first.close()
        await second.close()


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("-n", type=int, default=300)
    parser.add_argument("--racers", type=int, default=50)
    args = parser.parse_args()
    results: dict[str, object] = {}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "podbay.db"
        results["sqlite"] = await measure(lambda: SqliteStore.open(path), args.n, args.racers)
    with TemporaryCluster.start() as cluster:
        url = cluster.create_database()
        results["postgres"] = await measure(lambda: PostgresStore.open(url), args.n, args.racers)
    print(json.dumps(results, indent=2))
    for name, figures in results.items():
        assert isinstance(figures, dict)
        if figures["name_race_rows"] != 1 or figures["cas_race_winners"] != 1:
            raise SystemExit(f"{name}: a race did not end with exactly one winner")


if __name__ == "__main__":
    asyncio.run(main())
