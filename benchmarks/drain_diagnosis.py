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

from _databases import throwaway_database
from admit import BATCH, ROOMY, TENANTS, bulk_insert, configure, waiting_rows
from quotagate.cli.common import render_table
from quotagate.store import schema, statements
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


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--slices", type=int, default=10)
    settings = parser.parse_args(argv)
    rows: list[Any] = []
    for vacuum_between in (False, True):
        rows += drain(settings.requests, vacuum_between, settings.slices)
    print(render_table(["drain", "slice", "admitted", "admissions/s", "dead versions",
                        "head buffers", "head ms", "outbox rows", "audit rows"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
