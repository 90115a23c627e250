"""Why a sustained drain slows down: one drain as a user runs it, one with VACUUM between slices.

PostgreSQL only (its dead row versions are the suspect). The same queue
(benchmarks/admit.py's tenants, pools and costs, quotas never binding) is
drained twice by ``Ledger.admit(16)`` in one process, in slices of a tenth:

* ``as is`` — nothing vacuums during the drain, as on this server
  (autovacuum off) and for a user whose autovacuum has not come round yet;
* ``vacuumed`` — ``VACUUM qg_request`` between slices, outside the timing.

Per slice: admissions/s, dead versions in ``qg_request``
(``pg_stat_user_tables``), the head read's shared buffers and time
(``EXPLAIN (ANALYZE, BUFFERS)`` of the admission's head query, just before the
slice), and the outbox and audit rows so far. If the dead versions explain
the slowdown, the vacuumed drain stays flat and its head read stays small.

``--admitters 1,4 [--backend postgresql|mysql] [--pool-slices 1,4] [--batch 1]``: where
several admitters lose instead. The same drain by 1 and by 4 admitting
processes (benchmarks/admit.py's workers), once per slice count, while
benchmarks/_activity.py samples what the database's sessions wait on; per
drain the CPU seconds per admission of the admitters and of the database
backends (what bounds 4 processes on 2 cores), reruns by cause, rollbacks and
deadlocks, and the share of session samples per wait.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from _activity import ActivitySampler
from _databases import throwaway_database
from admit import (
    BATCH,
    POOLS,
    ROOMY,
    TENANTS,
    Run,
    WorkerPool,
    bulk_insert,
    check_balanced,
    configure,
    reset,
    waiting_rows,
)
from quotagate.cli.common import render_table
from quotagate.store import schema, statements
from quotagate.store.config import Configuration
from quotagate.store.engine import create_engine
from quotagate.store.ledger import DEFAULT_ADMISSION_WINDOW, Ledger


def head_read(engine: Engine) -> tuple[int, float]:
    """Shared buffers hit and milliseconds of one execution of the head query."""
    query = statements.head_query(len(TENANTS), DEFAULT_ADMISSION_WINDOW)
    sql = str(query.compile(dialect=engine.dialect))
    with engine.connect() as connection:
        plan = connection.exec_driver_sql(
            f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {sql}",
            statements.head_parameters(TENANTS) | {
                name: bind.value for name, bind in query.compile(dialect=engine.dialect)
                .binds.items() if not name.startswith("tenant_")},
        ).scalar_one()
    document = plan if isinstance(plan, list) else json.loads(plan)
    top = document[0]
    return int(top["Plan"].get("Shared Hit Blocks", 0)), float(top["Execution Time"])


def counts(engine: Engine) -> tuple[int, int, int]:
    with engine.connect() as connection:
        dead = connection.exec_driver_sql(
            "SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = 'qg_request'"
        ).scalar_one()
        outbox = connection.execute(sa.select(sa.func.count()).select_from(schema.outbox))
        audit = connection.execute(sa.select(sa.func.count()).select_from(schema.audit))
        return int(dead), int(outbox.scalar_one()), int(audit.scalar_one())


def vacuum(engine: Engine, what: str = "qg_request") -> None:
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        connection.exec_driver_sql(f"VACUUM {what}")


def drain(requests: int, vacuum_between: bool, slices: int) -> list[list[str]]:
    rows: list[list[str]] = []
    with throwaway_database("postgresql") as url:
        engine = create_engine(url)
        try:
            configure(engine, {tenant: {"gpu": ROOMY, "cpu": ROOMY} for tenant in TENANTS})
            bulk_insert(engine, waiting_rows(requests, TENANTS, prefix="dd",
                                             start=time.time() - 600, span=300, priority=0))
            ledger = Ledger(engine)
            per_slice = requests // slices
            admitted = 0
            for number in range(1, slices + 1):
                if vacuum_between and number > 1:
                    vacuum(engine)
                time.sleep(0.6)  # statistics reach pg_stat_* after at most 0.5 s idle
                dead, outbox, audit = counts(engine)
                buffers, milliseconds = head_read(engine)
                began = time.perf_counter()
                done = 0
                while done < per_slice:
                    got = len(ledger.admit(BATCH))
                    if got == 0:
                        break
                    done += got
                seconds = time.perf_counter() - began
                admitted += done
                rows.append(["vacuumed" if vacuum_between else "as is", str(number),
                             f"{admitted:,}", f"{done / seconds:,.0f}", f"{dead:,}",
                             f"{buffers:,}", f"{milliseconds:.2f}", f"{outbox:,}", f"{audit:,}"])
                print("  " + "  ".join(rows[-1]), file=sys.stderr, flush=True)
        finally:
            engine.dispose()
    return rows


def admitters(
    backend: str, requests: int, processes: Sequence[int], slice_counts: Sequence[int],
    rounds: int, batch: int = BATCH,
) -> tuple[list[list[str]], list[list[str]]]:
    """Drains by each number of ``processes``, per slice count and round: a summary row
    per drain, and the wait samples (share of session samples) per drain."""
    summary: list[list[str]] = []
    waits: list[list[str]] = []
    pool = WorkerPool(max(processes))
    try:
        with throwaway_database(backend) as url:
            engine = create_engine(url)
            try:
                configure(engine, {tenant: {"gpu": ROOMY, "cpu": ROOMY} for tenant in TENANTS})
                bulk_insert(engine, waiting_rows(requests, TENANTS, prefix="dd",
                                                 start=time.time() - 600, span=300, priority=0))
                for round_number in range(1, rounds + 1):
                    for slices in slice_counts:
                        for name in POOLS:
                            Configuration(engine).set_pool(name, {}, slices=slices)
                        for count in processes:
                            label = f"S={slices} P={count} r{round_number}"
                            row, shares = _diagnosed_drain(engine, url, pool, count, label, batch)
                            summary.append(row)
                            waits += [[label, wait, share] for wait, share in shares]
                            print("  " + "  ".join(row), file=sys.stderr, flush=True)
            finally:
                engine.dispose()
    finally:
        pool.close()
    return summary, waits


def _diagnosed_drain(
    engine: Engine, url: str, pool: WorkerPool, processes: int, label: str, batch: int = BATCH,
) -> tuple[list[str], list[tuple[str, str]]]:
    reset(engine)
    sampler = ActivitySampler(url).start()
    with open("/proc/loadavg") as loadavg:
        load = loadavg.read().split()[0]
    outcomes = pool.run(Run(url, False, batch, 3600.0, drain=True), processes)
    activity = sampler.stop()
    check_balanced(engine)
    admitted = sum(outcome.admitted for outcome in outcomes)
    elapsed = max(o.finished for o in outcomes) - min(o.started for o in outcomes)
    client = sum(outcome.cpu for outcome in outcomes)
    reruns: dict[str, int] = {}
    for outcome in outcomes:
        for cause, number in outcome.reruns:
            reruns[cause] = reruns.get(cause, 0) + number
    per = 1e6 / max(admitted, 1)
    row = [
        label, load, f"{admitted:,}", f"{admitted / elapsed:,.0f}", f"{client * per:.0f}",
        f"{activity.server_cpu * per:.0f}", f"{(client + activity.server_cpu) / elapsed:.2f}",
        " ".join(f"{cause}={number}" for cause, number in reruns.items() if number) or "-",
        f"{activity.commits:,}/{activity.rollbacks:,}/{activity.deadlocks}",
        # The sampler's own statements are autocommit transactions: one per sample.
        f"{admitted / max(activity.commits - activity.ticks, 1):.1f}"
        if activity.commits else "-",
    ]
    total = sum(activity.samples.values()) or 1
    shares = [(wait, f"{100 * number / total:.1f}%")
              for wait, number in activity.samples.most_common(8)]
    return row, shares


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--slices", type=int, default=10)
    parser.add_argument("--admitters", default=None,
                        help="comma-separated process counts (e.g. 1,4): diagnose several "
                             "admitters instead of the vacuum question")
    parser.add_argument("--backend", default="postgresql", choices=("postgresql", "mysql"))
    parser.add_argument("--pool-slices", default="1,4",
                        help="with --admitters: capacity slices per pool, one drain each")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--batch", type=int, default=BATCH,
                        help="with --admitters: the limit of each admit() call (1: admit(1))")
    settings = parser.parse_args(argv)
    if settings.admitters:
        summary, waits = admitters(
            settings.backend, settings.requests,
            [int(part) for part in settings.admitters.split(",")],
            [int(part) for part in settings.pool_slices.split(",")], settings.rounds,
            settings.batch)
        print(render_table(["drain", "load", "admitted", "admissions/s", "client CPU µs/adm",
                            "db CPU µs/adm", "cores busy", "reruns", "commit/rollback/deadlock",
                            "adm/commit"],
                           summary))
        print()
        print(render_table(["drain", "session state", "share of samples"], waits))
        return 0
    rows: list[Any] = []
    for vacuum_between in (False, True):
        rows += drain(settings.requests, vacuum_between, settings.slices)
    print(render_table(["drain", "slice", "admitted", "admissions/s", "dead versions",
                        "head buffers", "head ms", "outbox rows", "audit rows"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
