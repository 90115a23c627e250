"""What a worker's look for work past its max-runtime costs, next to one bare round trip.

    .venv/bin/python benchmarks/overrun_check.py [--backend postgresql] [--requests 100000]
        [--tenants 1000] [--calls 300] [--chunks 7]

On one throwaway ledger (``--tenants`` tenants, ``--requests`` requests, a fifth
of them running with a max-runtime of an hour, none past it) this times, chunk
by chunk interleaved, per call: ``SELECT 1`` on a pooled connection (the floor
of any statement), and ``overruns.stop_overruns`` (the whole look a worker pass
makes, docs/decisions/714) with no tenant opted in and with ``--opted`` tenants
opted in. Wall and CPU time (``time.process_time``), medians of the chunks; and
on PostgreSQL the plan of the look.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

import sqlalchemy as sa

from _databases import throwaway_database
from admit import bulk_insert
from quotagate.store import overruns, schema
from quotagate.store.engine import create_engine

NOW = 1_800_000_000.0


def _requests(count: int, tenants: int) -> Iterator[dict[str, Any]]:
    for index in range(count):
        running = index % 5 == 0
        yield {"id": f"r{index:08d}", "tenant": f"t{index % tenants:04d}",
               "state": "delivered" if running else "completed", "cost": '{"gpu":1}',
               "priority": 0, "payload": "null", "queue_key": NOW, "created": NOW,
               "updated": NOW, "max_runtime": 3600, "reserved_runtime": 3600,
               "admitted": NOW - 60 if running else NOW - 7200}


def _timed(call: Callable[[], object], calls: int) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(calls):
        call()
    return ((time.perf_counter() - wall) / calls * 1e6, (time.process_time() - cpu) / calls * 1e6)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", default="postgresql")
    parser.add_argument("--requests", type=int, default=100_000)
    parser.add_argument("--tenants", type=int, default=1000)
    parser.add_argument("--opted", type=int, default=10)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--chunks", type=int, default=7)
    options = parser.parse_args()
    with throwaway_database(options.backend) as url:
        engine = create_engine(url)
        with engine.begin() as connection:
            connection.execute(schema.tenant.insert(), [
                {"name": f"t{index:04d}", "created": NOW} for index in range(options.tenants)])
        bulk_insert(engine, _requests(options.requests, options.tenants))
        if options.backend == "postgresql":
            with engine.begin() as connection:
                connection.exec_driver_sql("ANALYZE")
        elif options.backend == "mysql":
            with engine.begin() as connection:
                connection.exec_driver_sql("ANALYZE TABLE qg_tenant, qg_request")

        def bare() -> None:
            with engine.connect() as connection:
                connection.execute(sa.text("SELECT 1")).all()

        def look() -> None:
            assert overruns.stop_overruns(engine, NOW, actor="bench") == []

        def opt(on: bool) -> None:
            with engine.begin() as connection:
                connection.execute(schema.tenant.update().where(
                    schema.tenant.c.name.in_([f"t{i:04d}" for i in range(options.opted)]))
                    .values(stop_at_max_runtime=on))

        results: dict[str, list[tuple[float, float]]] = {"SELECT 1": [], "look, none opted in": [],
                                                         f"look, {options.opted} opted in": []}
        for _ in range(options.chunks):
            results["SELECT 1"].append(_timed(bare, options.calls))
            results["look, none opted in"].append(_timed(look, options.calls))
            opt(True)
            results[f"look, {options.opted} opted in"].append(_timed(look, options.calls))
            opt(False)
        load = os.getloadavg()[0]
        print(f"{options.backend}: {options.requests} requests ({options.requests // 5} running), "
              f"{options.tenants} tenants; {options.chunks} chunks of {options.calls} calls; "
              f"load {load:.1f}; {time.strftime('%H:%M UTC', time.gmtime())}")
        print("| call | wall µs (median) | CPU µs (median) |\n|---|---|---|")
        for name, rows in results.items():
            print(f"| {name} | {statistics.median(row[0] for row in rows):.0f} | "
                  f"{statistics.median(row[1] for row in rows):.0f} |")
        if options.backend == "postgresql":
            with engine.connect() as connection:
                compiled = overruns.overruns_query().params(now=NOW, limit=256).compile(
                    engine, compile_kwargs={"literal_binds": True})
                plan = connection.exec_driver_sql("EXPLAIN " + str(compiled))
                print("\n".join(row[0] for row in plan))
        engine.dispose()


if __name__ == "__main__":
    main()
