"""How long SQLite admission holds the write lock, with 1 and 4 admitting processes.

    .venv/bin/python benchmarks/admit_lock_hold.py [--parts hold,spin,stale] [--seconds 3]
        [--rounds 2] [--processes 1,4] [--spin-us 150]

SQLite has one writer at a time (docs/decisions/005): with several admitting
processes one might expect the rate to be bounded by how long each holds the
lock, from its ``BEGIN IMMEDIATE`` returning to its ``COMMIT`` returning
(docs/decisions/058). Three parts, each on one throwaway ledger (4 tenants,
20,000 waiting, roomy quotas), kinds alternating a b b a:

``hold``: each process admits one request per transaction for ``--seconds``,
``Ledger.admit(1)`` against the raw transaction (``_raw_admission.py``). Every
driver connection is a sqlite3 connection whose ``BEGIN IMMEDIATE`` and
``commit`` note the monotonic clock (shared by the processes), so the
transactions of all processes are laid end to end. Printed: admissions/s, CPU
µs per admission (``time.process_time``, all processes); lock hold p50, p90 and
mean; mean wait at ``BEGIN IMMEDIATE``; the hold time summed over the run's
length ("lock held"; above 100 % where a holder is descheduled between the
lock's release inside ``commit`` and its return); how often the lock changed
hands; the share of transactions that read the admission snapshot (ours: kept
reads were stale, docs/decisions/033; raw: always); the median gap between one
process's holds; the median hold of the process taking the lock over and of the
one taking it back (both start on the page cache SQLite empties after another
connection's commit).

``spin``: the raw transaction with ``--spin-us`` of Python added inside the lock
(after ``BEGIN IMMEDIATE``) or outside it (before): does moving work out of the
lock raise the rate with several processes?

``stale``: one process; the CPU of the first four admissions after another
connection committed (a changed pool cap), against the steady state, ours and
raw (and raw with ``Ledger.admit``'s audit row, docs/decisions/032): what a change of hands
costs each.

The timing adds about a microsecond per statement to both kinds.
"""

from __future__ import annotations

import argparse
import itertools
import sqlite3
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

from _databases import throwaway_database
from _raw_admission import RawAdmission
from _timing import outcomes_of_processes
from admit import ROOMY, TENANTS, bulk_insert, configure, reset, waiting_rows
from quotagate.store.engine import create_engine
from quotagate.store.ledger import Ledger

# The admission snapshot's SQL (ours) and the raw transaction's usage read.
_SNAPSHOTS = ("AS kind, qg_tenant_quota.tenant AS holder", "SELECT 'tenant'")


class _Transactions:
    """One process's write transactions: when BEGIN was sent, when it returned, when COMMIT
    (or ROLLBACK) returned, and whether the transaction read the admission snapshot."""

    def __init__(self) -> None:
        self.began: list[float] = []
        self.locked: list[float] = []
        self.ended: list[float] = []
        self.read: list[bool] = []
        self.open = False
        self.reading = False

    def end(self) -> None:
        if self.open:
            self.ended.append(time.perf_counter())
            self.read.append(self.reading)
            self.open = False


_LOG = _Transactions()


class _NotingCursor(sqlite3.Cursor):
    def execute(self, sql: str, *parameters: Any) -> Any:  # type: ignore[override]
        if sql.startswith("BEGIN IMMEDIATE"):
            _LOG.began.append(time.perf_counter())
            super().execute(sql, *parameters)
            _LOG.locked.append(time.perf_counter())
            _LOG.open, _LOG.reading = True, False
            return self
        if any(marker in sql for marker in _SNAPSHOTS):
            _LOG.reading = True
        return super().execute(sql, *parameters)


class _NotingConnection(sqlite3.Connection):
    def cursor(self, factory: Any = _NotingCursor) -> Any:  # type: ignore[override]
        return super().cursor(factory)

    def commit(self) -> None:
        super().commit()
        _LOG.end()

    def rollback(self) -> None:
        super().rollback()
        _LOG.end()  # a rolled-back attempt held the lock too


def _connect(path: str, *, raw: bool) -> sqlite3.Connection:
    connection = sqlite3.connect(path, timeout=30, check_same_thread=False, isolation_level=None,
                                 factory=_NotingConnection)
    if raw:  # as RawAdmission sets up its own
        for pragma in ("journal_mode=WAL", "synchronous=NORMAL", "busy_timeout=30000"):
            connection.execute(f"PRAGMA {pragma}")
    return connection


def _spin(seconds: float) -> None:
    until = time.perf_counter() + seconds
    while time.perf_counter() < until:
        pass


def _admitter(url: str, kind: str, spin: float) -> tuple[Callable[[], int], Callable[[], None]]:
    """``kind``: ``raw``, ``raw + audit row``, ``ours``, ``raw, spin inside`` or ``raw, spin
    outside``."""
    path = url.removeprefix("sqlite:///")
    if kind == "ours":
        engine = create_engine(url, creator=partial(_connect, path, raw=False))
        ledger = Ledger(engine)

        def close() -> None:
            ledger.close()
            engine.dispose()

        return (lambda: len(ledger.admit(1))), close
    baseline = RawAdmission(url, TENANTS, audit=kind == "raw + audit row")
    baseline.connection.close()
    baseline.connection = _connect(path, raw=True)
    if kind == "raw, spin inside":
        read_usage = baseline._read_usage  # the first statement after BEGIN IMMEDIATE

        def spun_read(cursor: Any) -> Any:
            _spin(spin)
            return read_usage(cursor)

        baseline._read_usage = spun_read  # type: ignore[method-assign]
    elif kind == "raw, spin outside":
        admit_one = baseline.admit_one

        def spun() -> int:
            _spin(spin)
            return admit_one()

        return spun, baseline.close
    return baseline.admit_one, baseline.close


def _worker(url: str, kind: str, spin: float, seconds: float, start_at: float,
            results: Any) -> None:
    admit, close = _admitter(url, kind, spin)
    for _ in range(3):  # warm up: connection, statement caches, the first expiry pass
        admit()
    while time.monotonic() < start_at:
        time.sleep(0.0005)
    global _LOG
    _LOG = _Transactions()
    admitted = 0
    cpu = time.process_time()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        admitted += admit()
    cpu = time.process_time() - cpu
    results.put((admitted, cpu, _LOG.began, _LOG.locked, _LOG.ended, _LOG.read))
    close()


@dataclass(frozen=True)
class _Span:
    taken: float
    released: float
    process: int
    read: bool

    @property
    def hold(self) -> float:
        return self.released - self.taken


def _median_us(values: Sequence[float]) -> str:
    return f"{statistics.median(values) * 1e6:.0f}" if values else "-"


def _run(url: str, kind: str, processes: int, seconds: float, spin: float) -> list[str]:
    outcomes = outcomes_of_processes(_worker, (url, kind, spin, seconds), processes, seconds)
    admitted = sum(outcome[0] for outcome in outcomes)
    cpu = sum(outcome[1] for outcome in outcomes)
    spans: list[_Span] = []
    waits: list[float] = []
    for process, (_admitted, _cpu, began, locked, ended, read) in enumerate(outcomes):
        for sent, taken, released, reading in zip(began, locked, ended, read, strict=False):
            spans.append(_Span(taken, released, process, reading))
            waits.append(taken - sent)
    spans.sort(key=lambda span: span.taken)
    holds = [span.hold for span in spans]
    length = max(span.released for span in spans) - spans[0].taken
    pairs = list(itertools.pairwise(spans))
    same_gaps = [after.taken - before.released for before, after in pairs
                 if before.process == after.process]
    taken_over = [after.hold for before, after in pairs if before.process != after.process]
    taken_back: list[float] = []
    for index, (before, after) in enumerate(pairs):
        if before.process != after.process:
            back = next((span for span in spans[index + 2:] if span.process == before.process),
                        None)
            if back is not None:
                taken_back.append(back.hold)
    return [
        kind, str(processes), f"{admitted / seconds:,.0f}", f"{cpu / max(admitted, 1) * 1e6:.0f}",
        _median_us(holds), f"{statistics.quantiles(holds, n=10)[-1] * 1e6:.0f}",
        f"{statistics.fmean(holds) * 1e6:.0f}", f"{statistics.fmean(waits) * 1e6:.0f}",
        f"{sum(holds) / length:.0%}", f"{len(taken_over) / max(len(pairs), 1):.1%}",
        f"{sum(span.read for span in spans) / len(spans):.0%}", _median_us(same_gaps),
        _median_us(taken_over), _median_us(taken_back),
    ]


_HOLD_COLUMNS = ["kind", "processes", "adm/s", "CPU µs/adm", "hold p50", "hold p90", "hold mean",
                 "BEGIN wait", "lock held", "changed hands", "read snapshot", "gap p50 (same)",
                 "hold p50 taking over", "hold p50 taking back"]


def _alternating(kinds: Sequence[str], round_number: int) -> Sequence[str]:
    return kinds if round_number % 2 == 0 else list(reversed(kinds))


def measure_holds(url: str, engine: Any, arguments: argparse.Namespace,
                  kinds: Sequence[str]) -> list[list[str]]:
    rows: list[list[str]] = []
    for round_number in range(arguments.rounds):
        for processes in arguments.process_counts:
            for kind in _alternating(kinds, round_number):
                reset(engine)
                rows.append(_run(url, kind, processes, arguments.seconds,
                                 arguments.spin_us / 1e6))
    return rows


def measure_stale(url: str, engine: Any, cycles: int) -> list[list[str]]:
    """CPU µs of the first four admissions after another connection's commit, and of
    admissions after the admitter's own commits only, ours and raw, in one process."""
    path = url.removeprefix("sqlite:///")
    other = sqlite3.connect(path, isolation_level=None, timeout=30)

    def foreign_commit() -> None:
        other.execute("BEGIN IMMEDIATE")
        other.execute("UPDATE qg_pool_capacity SET cap = cap + 1"
                      " WHERE pool = 'pool-3' AND resource = 'cpu'")
        other.execute("COMMIT")

    rows: list[list[str]] = []
    for kind in ("raw", "raw + audit row", "ours"):
        reset(engine)
        admit, close = _admitter(url, kind, 0.0)
        for _ in range(20):
            admit()
        after: list[list[float]] = [[] for _ in range(4)]
        steady: list[float] = []
        for _ in range(cycles):
            for _ in range(3):
                started = time.process_time()
                admit()
                steady.append(time.process_time() - started)
            foreign_commit()
            for position in range(4):
                started = time.process_time()
                admit()
                after[position].append(time.process_time() - started)
        close()
        rows.append([kind, _median_us(steady), *(_median_us(values) for values in after),
                     f"{sum(statistics.median(values) - statistics.median(steady) for values in after) * 1e6:.0f}"])
    other.close()
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    from quotagate.cli.common import render_table

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default="hold,spin,stale")
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--processes", default="1,4")
    parser.add_argument("--spin-us", type=float, default=150.0)
    parser.add_argument("--cycles", type=int, default=300, help="foreign commits (part stale)")
    arguments = parser.parse_args(argv)
    arguments.process_counts = [int(part) for part in arguments.processes.split(",")]
    parts = set(arguments.parts.split(","))
    with throwaway_database("sqlite") as url:
        engine = create_engine(url)
        configure(engine, {tenant: {"gpu": ROOMY, "cpu": ROOMY} for tenant in TENANTS})
        bulk_insert(engine, waiting_rows(20_000, TENANTS, prefix="lh", start=time.time() - 600,
                                         span=300, priority=0))
        if "hold" in parts:
            print("Write lock per admission (µs; hold: BEGIN IMMEDIATE returned -> COMMIT returned)")
            print(render_table(_HOLD_COLUMNS, measure_holds(url, engine, arguments,
                                                            ("raw", "ours"))), flush=True)
        if "spin" in parts:
            print(f"\nThe raw transaction with {arguments.spin_us:.0f} µs of Python inside or "
                  "outside the write lock")
            print(render_table(_HOLD_COLUMNS, measure_holds(
                url, engine, arguments, ("raw, spin inside", "raw, spin outside"))), flush=True)
        if "stale" in parts:
            print(f"\nCPU µs per admission, one process, after another connection's commit "
                  f"(medians of {arguments.cycles})")
            print(render_table(["kind", "steady", "1st after", "2nd", "3rd", "4th",
                                "the four over steady"],
                               measure_stale(url, engine, arguments.cycles)))
        engine.dispose()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
