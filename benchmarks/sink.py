"""Sink write throughput: ``SinkStore.write_batch`` next to a plain INSERT of the same rows.

Every variant writes batches of the same rows (an id, a tenant, an amount, a note)
in one transaction, in the same chunks, into a table with the same unique key:

- baseline: a plain multi-row INSERT of new rows, nothing else;
- sink, new rows: insert-if-absent plus the batch marker;
- sink, new rows, fenced: the same plus the fence row's locking read;
- sink, replayed batch: the same batch again, every row a conflict.

No Spark: this is the database side of each ``foreachBatch`` call. Rounds alternate
between the variants so that load from other processes hits all alike.

    .venv/bin/python benchmarks/sink.py [--backends sqlite,postgresql,mysql] [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).parent))

from _databases import BACKENDS, ServerUnavailable, throwaway_database
from quotagate.streaming import Fencing, SinkStore
from quotagate.streaming.sink_sql import chunk_rows

KEYS = ["event_id"]
CHUNK = 500


def columns() -> list[sa.Column[Any]]:
    return [sa.Column("event_id", sa.String(64), nullable=False), sa.Column("tenant", sa.String(63)),
            sa.Column("amount", sa.BigInteger), sa.Column("note", sa.Text)]


def rows(round_number: int, variant: str, count: int) -> list[dict[str, Any]]:
    return [{"event_id": f"{variant}-{round_number}-{index}", "tenant": "team-a", "amount": index,
             "note": "x" * 40} for index in range(count)]


def measure(backend: str, count: int, rounds: int) -> dict[str, float]:
    with throwaway_database(backend, create_schema=False) as url, SinkStore(url, chunk_size=CHUNK) as store:
        sink_table = store.business_table("events", KEYS, columns)
        plain_table = sa.Table("plain_events", sa.MetaData(), *columns(), sa.UniqueConstraint(*KEYS))
        plain_table.create(store.engine)
        chunk = chunk_rows(len(plain_table.c), CHUNK)

        def plain(batch: list[dict[str, Any]]) -> None:
            with store.engine.begin() as connection:
                for start in range(0, len(batch), chunk):
                    # The sink's own form of a multi-row INSERT on this engine, minus insert-if-absent.
                    if connection.dialect.name == "mysql":
                        connection.execute(plain_table.insert().values(batch[start:start + chunk]))
                    else:
                        connection.execute(plain_table.insert(), batch[start:start + chunk])

        timings: dict[str, list[float]] = {}

        def timed(name: str, work: Callable[[], object]) -> None:
            started = time.perf_counter()
            work()
            timings.setdefault(name, []).append(count / (time.perf_counter() - started))

        for number in range(rounds):
            fresh = rows(number, "sink", count)
            fenced = rows(number, "fenced", count)
            baseline = rows(number, "plain", count)
            timed("baseline: plain INSERT", lambda batch=baseline: plain(batch))
            timed("sink, new rows", lambda number=number, batch=fresh: store.write_batch(
                "bench", 2 * number, sink_table, KEYS, lambda: batch))
            timed("sink, new rows, fenced", lambda number=number, batch=fenced: store.write_batch(
                "bench-fenced", number, sink_table, KEYS, lambda: batch, fencing=Fencing("job", 1)))
            timed("sink, replayed batch", lambda number=number, batch=fresh: store.write_batch(
                "bench", 2 * number, sink_table, KEYS, lambda: batch))
        expected = rounds * count
        if store.count_rows("events") != 2 * expected:
            raise AssertionError("the sink wrote a different number of rows than it was given")
        return {name: statistics.median(values) for name, values in timings.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backends", default=",".join(BACKENDS))
    parser.add_argument("--quick", action="store_true", help="fewer, smaller rounds")
    arguments = parser.parse_args()
    count, rounds = (1000, 3) if arguments.quick else (5000, 7)
    print(f"{count} rows per batch, median of {rounds} rounds, rows per second", file=sys.stderr)
    lines = ["| backend | variant | rows/s | vs baseline |", "|---|---|---:|---:|"]
    for backend in arguments.backends.split(","):
        print(f"measuring {backend}…", file=sys.stderr)
        try:
            results = measure(backend, count, rounds)
        except ServerUnavailable as error:
            print(f"skipping {backend}: {error}", file=sys.stderr)
            continue
        baseline = results["baseline: plain INSERT"]
        for name, value in results.items():
            lines.append(f"| {backend} | {name} | {value:,.0f} | {value / baseline:.2f}x |")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
