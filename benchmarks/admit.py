"""Admission throughput and latency of ``Ledger.admit``, next to raw SQL in the same run.

    .venv/bin/python benchmarks/admit.py [--backends sqlite,postgresql,mysql] [--quick]

For each backend, in its own throwaway database:

1. admissions per second with 1 and 4 admitting *processes* (each with its own
   engine), one request per transaction (``admit(1)``) and in batches
   (``admit(16)``), next to the same transaction written as raw SQL through the
   driver (``_raw_admission.py``) with 1 and 4 processes: the limit we measure
   against. Ours is printed as a percentage of it.
2. the median and p95 latency of one ``admit(1)`` with 1,000 and with 100,000
   waiting requests, and with 100,000 where the head of the queue belongs to a
   tenant at its cap (its requests fill the index range admission reads first).

Throughput runs for a fixed time; every run starts from the same queue (the
requests are put back to waiting and the usage to zero between runs).
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import queue
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from _databases import BACKENDS, ServerUnavailable, throwaway_database
from _raw_admission import RawAdmission
from quotagate.cli.common import render_table
from quotagate.domain.ordering import DEFAULT_AGING_INTERVAL, queue_key
from quotagate.store import schema
from quotagate.store.config import Configuration
from quotagate.store.engine import create_engine
from quotagate.store.ledger import Ledger
from quotagate.store.rows import encode_cost
from quotagate.store.views import LedgerViews

TENANTS = ("team-a", "team-b", "team-c", "team-d")
# Caps far above what a run admits: throughput measures admission, not blocking.
ROOMY = 1_000_000_000
POOLS = {
    "pool-1": {"gpu": ROOMY, "cpu": ROOMY},
    "pool-2": {"gpu": ROOMY // 2, "cpu": ROOMY // 2},
    "pool-3": {"gpu": ROOMY // 4, "cpu": ROOMY},
}
# Multi-resource costs, cycled through the queue.
COSTS = ({"gpu": 1, "cpu": 2}, {"gpu": 2, "cpu": 8}, {"cpu": 4}, {"gpu": 1, "cpu": 1})
BATCH = 16
# The tenant at its cap in the pathological latency case: every request needs a gpu.
HOG_GPU_CAP = 4
HOG_COST = {"gpu": 1, "cpu": 2}
INSERT_CHUNK = 5000


@dataclass(frozen=True)
class Settings:
    seconds: float  # length of one throughput run
    rounds: int  # throughput runs of each kind; the best counts
    queue: int  # waiting requests at the start of each throughput run
    samples: int  # admissions timed per latency scenario
    big_queue: int


FULL = Settings(seconds=3.0, rounds=2, queue=30_000, samples=300, big_queue=100_000)
QUICK = Settings(seconds=1.0, rounds=1, queue=8_000, samples=60, big_queue=20_000)


# -- the queue ---------------------------------------------------------------


def waiting_rows(
    count: int,
    tenants: Sequence[str],
    *,
    prefix: str,
    start: float,
    span: float,
    priority: int,
    costs: Sequence[dict[str, int]] = COSTS,
) -> Iterator[dict[str, Any]]:
    """``count`` waiting requests, created evenly over ``span`` seconds from ``start``.

    ``queue_key`` is computed exactly as ``Ledger.submit`` does, so the queue
    order is the one real submissions would have.
    """
    for index in range(count):
        created = start + span * index / max(count, 1)
        request_priority = priority + index % 3
        yield {
            "id": f"{prefix}-{index:07d}",
            "tenant": tenants[index % len(tenants)],
            "state": "waiting",
            "cost": encode_cost(costs[index % len(costs)]),
            "priority": request_priority,
            "payload": "{}",
            "target": None,
            "pool": None,
            "queue_key": queue_key(request_priority, created, DEFAULT_AGING_INTERVAL),
            "created": created,
            "updated": created,
            "reason": None,
        }


def bulk_insert(engine: Engine, rows: Iterator[dict[str, Any]]) -> None:
    """Insert in chunks with executemany (batched multi-row INSERTs), not submit by submit."""
    with engine.begin() as connection:
        chunk: list[dict[str, Any]] = []
        for row in rows:
            chunk.append(row)
            if len(chunk) == INSERT_CHUNK:
                connection.execute(schema.request.insert(), chunk)
                chunk = []
        if chunk:
            connection.execute(schema.request.insert(), chunk)
    analyze(engine)


def analyze(engine: Engine) -> None:
    """Fresh planner statistics, as autovacuum / auto-analyze would give a live system."""
    backend = engine.dialect.name
    if backend == "sqlite":
        with engine.begin() as connection:
            connection.exec_driver_sql("ANALYZE")
        return
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:
        if backend == "postgresql":
            connection.exec_driver_sql("VACUUM ANALYZE")
        else:
            for table in ("qg_request", "qg_tenant_quota", "qg_pool_capacity", "qg_outbox"):
                connection.exec_driver_sql(f"ANALYZE TABLE {table}").all()


def configure(engine: Engine, quotas: dict[str, dict[str, int]]) -> None:
    configuration = Configuration(engine)
    for tenant, quota in quotas.items():
        configuration.set_tenant(tenant, quota)
    for pool, capacity in POOLS.items():
        configuration.set_pool(pool, capacity)


def reset(engine: Engine) -> None:
    """Put every request back to waiting and all usage to zero: the next run starts equal."""
    with engine.begin() as connection:
        connection.execute(
            schema.request.update()
            .where(schema.request.c.state != "waiting")
            .values(state="waiting", pool=None)
        )
        connection.execute(schema.tenant_quota.update().values(used=0))
        connection.execute(schema.pool_capacity.update().values(used=0))
        connection.execute(schema.outbox.delete())
        connection.execute(schema.audit.delete())
    analyze(engine)


# -- throughput --------------------------------------------------------------


@dataclass(frozen=True)
class Run:
    url: str
    raw: bool  # raw SQL through the driver instead of Ledger.admit
    batch: int
    seconds: float


@dataclass(frozen=True)
class WorkerResult:
    admitted: int
    started: float
    finished: float
    error: str | None = None


def _admitter(run: Run) -> tuple[Callable[[], int], Callable[[], None]]:
    """A function admitting once and returning how many, and one closing the connection."""
    if run.raw:
        raw = RawAdmission(run.url, TENANTS)
        return raw.admit_one, raw.close
    ledger = Ledger(create_engine(run.url))
    return (lambda: len(ledger.admit(run.batch))), ledger.engine.dispose


def _admit_until(admit: Callable[[], int], start_at: float, seconds: float) -> WorkerResult:
    while time.monotonic() < start_at:
        time.sleep(0.0005)
    started = finished = time.monotonic()
    deadline = started + seconds
    admitted = idle = 0
    while time.monotonic() < deadline:
        count = admit()
        if count:
            admitted += count
            finished = time.monotonic()
            idle = 0
        else:
            # Nothing fitted: the queue ran dry (or every candidate was locked by
            # the others for a moment). Give up after a short stretch of nothing.
            idle += 1
            if idle >= 50:
                break
            time.sleep(0.001)
    return WorkerResult(admitted, started, finished)


def _worker(commands: Any, replies: Any) -> None:
    """One admitting process, reused across runs: a run is 'prepare', then 'start at'."""
    while (run := commands.get()) is not None:
        try:
            admit, close = _admitter(run)
        except Exception as error:  # reported to the parent, which stops the benchmark
            replies.put(WorkerResult(0, 0.0, 0.0, f"{type(error).__name__}: {error}"))
            commands.get()
            continue
        try:
            for _ in range(3):  # warm up: connection, statement caches, the first expiry pass
                admit()
            replies.put("ready")
            start_at = commands.get()
            replies.put(_admit_until(admit, start_at, run.seconds))
        except Exception as error:
            replies.put(WorkerResult(0, 0.0, 0.0, f"{type(error).__name__}: {error}"))
        finally:
            close()


class WorkerPool:
    """Admitting processes started once (spawn: nothing inherited) and reused for every run."""

    def __init__(self, size: int) -> None:
        context = multiprocessing.get_context("spawn")
        self.channels = [(context.Queue(), context.Queue()) for _ in range(size)]
        self.processes = [
            context.Process(target=_worker, args=channel, daemon=True) for channel in self.channels
        ]
        for process in self.processes:
            process.start()

    def close(self) -> None:
        for commands, _replies in self.channels:
            commands.put(None)
        for process in self.processes:
            process.join(timeout=30)

    def _reply(self, index: int, timeout: float) -> Any:
        _commands, replies = self.channels[index]
        deadline = time.monotonic() + timeout
        while True:
            try:
                return replies.get(timeout=1)
            except queue.Empty:
                if not self.processes[index].is_alive():
                    raise RuntimeError("an admitting process died") from None
                if time.monotonic() > deadline:
                    raise RuntimeError("an admitting process stopped answering") from None

    def throughput(self, run: Run, processes: int) -> float:
        """Admissions per second over ``processes`` processes, common start to last admission."""
        used = range(processes)
        for index in used:
            self.channels[index][0].put(run)
        for index in used:
            ready = self._reply(index, 120)
            if isinstance(ready, WorkerResult):
                raise RuntimeError(f"an admitting process failed: {ready.error}")
        start_at = time.monotonic() + 0.05
        for index in used:
            self.channels[index][0].put(start_at)
        outcomes: list[WorkerResult] = [self._reply(index, run.seconds + 120) for index in used]
        for outcome in outcomes:
            if outcome.error:
                raise RuntimeError(f"an admitting process failed: {outcome.error}")
        elapsed = max(o.finished for o in outcomes) - min(o.started for o in outcomes)
        total = sum(o.admitted for o in outcomes)
        return total / elapsed if elapsed > 0 else 0.0


def check_balanced(engine: Engine) -> None:
    """Invariants 1 and 2 after a run: a fast admission that oversold would not count."""
    violations = LedgerViews(engine).check_invariants()
    if violations:
        raise RuntimeError("the ledger does not balance after a run: " + "; ".join(violations[:5]))


def measure_throughput(
    backend: str, settings: Settings, pool: WorkerPool, log: Callable[[str], None]
) -> list[list[str]]:
    kinds = {"raw": (True, 1), "admit(1)": (False, 1), f"admit({BATCH})": (False, BATCH)}
    best: dict[tuple[str, int], float] = {}
    with throwaway_database(backend) as url:
        engine = create_engine(url)
        try:
            configure(engine, {tenant: {"gpu": ROOMY, "cpu": ROOMY} for tenant in TENANTS})
            bulk_insert(engine, waiting_rows(settings.queue, TENANTS, prefix="tp",
                                             start=time.time() - 600, span=300, priority=0))
            # Raw and ours alternate, round after round, so that the other load
            # on the machine weighs on both alike; each keeps its best round.
            for processes in (1, 4):
                for _round in range(settings.rounds):
                    for kind, (raw, batch) in kinds.items():
                        reset(engine)
                        rate = pool.throughput(Run(url, raw, batch, settings.seconds), processes)
                        check_balanced(engine)
                        log(f"  {backend}: {kind}, {processes} process(es): {rate:,.0f}/s")
                        best[kind, processes] = max(rate, best.get((kind, processes), 0.0))
        finally:
            engine.dispose()
    rows: list[list[str]] = []
    for kind in kinds:
        if kind == "raw":
            continue
        for processes in (1, 4):
            rate, raw_rate = best[kind, processes], best["raw", processes]
            rows.append([
                backend, kind, str(processes), f"{rate:,.0f}", f"{raw_rate:,.0f}",
                f"{100 * rate / raw_rate:.0f}%" if raw_rate else "-",
            ])
    return rows


# -- latency -----------------------------------------------------------------


def _percentile(values: Sequence[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def _timed(admitters: Sequence[Callable[[], int]], samples: int) -> list[tuple[float, float]]:
    """Median and p95 in milliseconds of ``samples`` calls of each admitter.

    The admitters take turns, call after call, so that the other load on the
    machine weighs on each alike. Every call must admit exactly one request.
    """
    for admit in admitters:
        for _ in range(5):
            admit()
    durations: list[list[float]] = [[] for _ in admitters]
    for _ in range(samples):
        for admit, timings in zip(admitters, durations, strict=True):
            started = time.perf_counter()
            admitted = admit()
            timings.append(time.perf_counter() - started)
            if admitted != 1:
                raise RuntimeError(f"an admission admitted {admitted}, expected 1: setup is wrong")
    return [
        (1000 * statistics.median(timings), 1000 * _percentile(timings, 0.95))
        for timings in durations
    ]


def _admit_one(ledger: Ledger) -> Callable[[], int]:
    return lambda: len(ledger.admit(1))


def fill_queue(url: str, settings: Settings, waiting: int, *, capped_head: bool) -> list[str]:
    """Configure a fresh ledger with ``waiting`` requests; return the tenant names.

    The queue gets as many extra requests as the timed admissions take away, so
    that ``waiting`` are still there at the last sample.
    """
    extra = 2 * (settings.samples + 5)
    quotas = {tenant: {"gpu": ROOMY, "cpu": ROOMY} for tenant in TENANTS}
    now = time.time()
    engine = create_engine(url)
    try:
        if not capped_head:
            configure(engine, quotas)
            bulk_insert(engine, waiting_rows(waiting + extra, TENANTS, prefix="lat",
                                             start=now - 600, span=300, priority=0))
            return list(TENANTS)
        # "hog" holds 99% of the queue, all of it ahead of everyone else (older
        # and higher priority), and is at its gpu cap: every admission must
        # look past its head to find the requests of the others.
        quotas["hog"] = {"gpu": HOG_GPU_CAP, "cpu": ROOMY}
        configure(engine, quotas)
        bulk_insert(engine, waiting_rows(waiting - waiting // 100, ["hog"], prefix="hog",
                                         start=now - 900, span=300, priority=5,
                                         costs=(HOG_COST,)))
        bulk_insert(engine, waiting_rows(waiting // 100 + extra, TENANTS, prefix="lat",
                                         start=now - 600, span=300, priority=0))
        filler = Ledger(engine)
        for _ in range(HOG_GPU_CAP):  # the hog's requests come first: fill it to its cap
            filler.admit(1)
        with engine.connect() as connection:
            hog_used = connection.execute(
                sa.select(schema.tenant_quota.c.used).where(
                    schema.tenant_quota.c.tenant == "hog",
                    schema.tenant_quota.c.resource == "gpu",
                )
            ).scalar_one()
        if hog_used != HOG_GPU_CAP:
            raise RuntimeError(f"the hog should be at its cap, it uses {hog_used}")
        return [*TENANTS, "hog"]
    finally:
        engine.dispose()


def measure_latency(
    backend: str, settings: Settings, log: Callable[[str], None]
) -> list[list[str]]:
    """Latency of ``admit(1)`` and of the raw transaction on three queues at once.

    All three databases exist together and the samples go round all of them
    (ours and raw on each), so a burst of other load on the machine cannot make
    one queue size look slower than another.
    """
    scenarios = (
        (1_000, False, "1,000 waiting"),
        (settings.big_queue, False, f"{settings.big_queue:,} waiting"),
        (settings.big_queue, True, f"{settings.big_queue:,} waiting, head at cap"),
    )
    with contextlib.ExitStack() as stack:
        admitters: list[Callable[[], int]] = []
        engines: list[Engine] = []
        for waiting, capped_head, _label in scenarios:
            url = stack.enter_context(throwaway_database(backend))
            tenants = fill_queue(url, settings, waiting, capped_head=capped_head)
            engine = create_engine(url)
            stack.callback(engine.dispose)
            engines.append(engine)
            ledger = Ledger(engine)
            raw = RawAdmission(url, tenants)
            stack.callback(raw.close)
            admitters += [_admit_one(ledger), raw.admit_one]
        timings = _timed(admitters, settings.samples)
        for engine in engines:
            check_balanced(engine)
    rows: list[list[str]] = []
    for index, (_waiting, _capped, label) in enumerate(scenarios):
        (median, p95), (raw_median, raw_p95) = timings[2 * index], timings[2 * index + 1]
        log(f"  {backend}: {label}: median {median:.2f} ms, p95 {p95:.2f} ms")
        rows.append([backend, label, f"{median:.2f}", f"{p95:.2f}", f"{raw_median:.2f}",
                     f"{raw_p95:.2f}"])
    return rows


# -- main --------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--backends", default=",".join(BACKENDS),
                        help="comma-separated: sqlite,postgresql,mysql (default: all)")
    parser.add_argument("--quick", action="store_true", help="shorter runs, fewer samples")
    arguments = parser.parse_args(argv)
    backends = [name.strip() for name in arguments.backends.split(",") if name.strip()]
    unknown = sorted(set(backends) - set(BACKENDS))
    if unknown:
        parser.error(f"unknown backend(s) {', '.join(unknown)}; choose from {', '.join(BACKENDS)}")
    settings = QUICK if arguments.quick else FULL

    began = time.monotonic()

    def log(line: str) -> None:
        print(f"[{time.monotonic() - began:5.0f} s] {line}", file=sys.stderr, flush=True)

    throughput_rows: list[list[str]] = []
    latency_rows: list[list[str]] = []
    skipped: list[str] = []
    pool = WorkerPool(4)
    try:
        for backend in backends:
            log(f"{backend}:")
            try:
                throughput_rows += measure_throughput(backend, settings, pool, log)
                latency_rows += measure_latency(backend, settings, log)
            except ServerUnavailable as error:
                log(f"  skipped: {error}")
                skipped.append(f"{backend} skipped: {error}")
    finally:
        pool.close()
    print()
    print(f"Admissions per second ({settings.seconds:g} s runs, {settings.queue:,} waiting at "
          f"start, {len(TENANTS)} tenants, {len(POOLS)} pools, costs over gpu+cpu; raw SQL "
          "admits one per transaction)")
    print(render_table(
        ["backend", "scenario", "processes", "admissions/s", "raw SQL/s", "ours/raw"],
        throughput_rows,
    ))
    print()
    print(f"Latency of one admit(1), milliseconds ({settings.samples} samples each)")
    print(render_table(
        ["backend", "queue", "median", "p95", "raw median", "raw p95"], latency_rows,
    ))
    for line in skipped:
        print(line)
    print(f"\ntotal time {time.monotonic() - began:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
