"""SQLite admission's kept reads (docs/decisions/033): how often 1 and 4 admitting
processes reuse them, and what an admission costs with and without them, same run.

    .venv/bin/python benchmarks/admission_reads.py [--seconds 3] [--rounds 2]

Each process admits ``--batch`` (1) requests per call for ``--seconds`` on one throwaway
ledger (4 tenants, 20,000 waiting, roomy quotas), once with the reads kept
(``Ledger(..., reuse_reads=True)``, the default) and once reading at every
admission, alternating round by round. It prints admissions per second, the
share of admit calls that read the snapshot (sqlite3's trace callback: this
timing adds a little to both kinds alike), CPU µs per admission
(``time.process_time``) and, for one process, the median wall time from the
admission's ``BEGIN IMMEDIATE`` to its return: how long it holds the write lock.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import sqlalchemy as sa

from _databases import throwaway_database
from _timing import outcomes_of_processes
from admit import ROOMY, TENANTS, bulk_insert, configure, reset, waiting_rows
from quotagate.store.engine import create_engine
from quotagate.store.ledger import Ledger

_SNAPSHOT = "AS kind, qg_tenant_quota.tenant AS holder"


class _Trace:
    """sqlite3's trace callback: counts snapshot reads, notes the last BEGIN IMMEDIATE."""

    def __init__(self) -> None:
        self.reads = 0
        self.begun = 0.0

    def __call__(self, sql: str) -> None:
        if sql.startswith("BEGIN IMMEDIATE"):
            self.begun = time.perf_counter()
        elif _SNAPSHOT in sql:
            self.reads += 1


def _admitter(url: str, reuse: bool, batch: int, seconds: float, start_at: float,
              results: Any) -> None:
    engine = create_engine(url)
    trace = _Trace()
    sa.event.listen(engine, "connect",
                    lambda dbapi, _record: dbapi.set_trace_callback(trace))
    ledger = Ledger(engine, reuse_reads=reuse)
    for _ in range(3):
        ledger.admit(batch)
    while time.monotonic() < start_at:
        time.sleep(0.0005)
    trace.reads = 0
    held: list[float] = []
    admitted = calls = 0
    cpu = time.process_time()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        admitted += len(ledger.admit(batch))
        calls += 1
        held.append(time.perf_counter() - trace.begun)  # the last BEGIN was the admission's
    cpu = time.process_time() - cpu
    results.put((admitted, trace.reads, cpu, statistics.median(held) if held else 0.0, calls))
    ledger.close()
    engine.dispose()


def _run(
    url: str, reuse: bool, batch: int, processes: int, seconds: float
) -> tuple[float, float, float, float]:
    outcomes = outcomes_of_processes(_admitter, (url, reuse, batch, seconds), processes, seconds)
    admitted = sum(outcome[0] for outcome in outcomes)
    reads = sum(outcome[1] for outcome in outcomes)
    calls = sum(outcome[4] for outcome in outcomes)
    cpu = sum(outcome[2] for outcome in outcomes)
    return (admitted / seconds, reads / max(calls, 1), cpu / max(admitted, 1) * 1e6,
            statistics.median(outcome[3] for outcome in outcomes) * 1e6)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--batch", type=int, default=1, help="the limit of each admit call")
    arguments = parser.parse_args()
    rows: list[str] = []
    with throwaway_database("sqlite") as url:
        engine = create_engine(url)
        configure(engine, {tenant: {"gpu": ROOMY, "cpu": ROOMY} for tenant in TENANTS})
        bulk_insert(engine, waiting_rows(20_000, TENANTS, prefix="ar", start=time.time() - 600,
                                         span=300, priority=0))
        for _round in range(arguments.rounds):
            for processes in (1, 4):
                for reuse in (True, False):
                    reset(engine)
                    rate, reads, cpu, held = _run(url, reuse, arguments.batch, processes,
                                                  arguments.seconds)
                    rows.append(f"{'kept' if reuse else 'read':<5} {processes:>9} {rate:>12,.0f} "
                                f"{reads:>15.0%} {cpu:>11,.0f} {held:>16,.0f}")
        engine.dispose()
    print(f"admit({arguments.batch})")
    print("reads processes admissions/s snapshot reads CPU µs/adm BEGIN→done µs")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
