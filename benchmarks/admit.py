"""Admission throughput and latency of ``Ledger.admit``, next to raw SQL in the same run.

    .venv/bin/python benchmarks/admit.py [--backends sqlite,postgresql,mysql] [--quick]

For each backend, in its own throwaway database:

1. admissions per second with 1 and 4 admitting *processes* (each with its own
   engine), one request per transaction (``admit(1)``) and in batches
   (``admit(16)``), next to the same transaction written as raw SQL through the
   driver (``_raw_admission.py``) with 1 and 4 processes: the limit we measure
   against. Ours is printed as a percentage of it.
2. the median and p95 latency of one ``admit(1)`` with 1,000 and with 100,000
   waiting requests (``--million``: and 1,000,000), each also where the head of
   the queue belongs to a tenant at its cap (its requests fill the index range
   admission reads first); for plain tenants, for cohort members that borrow
   (the setup of part ``cohorts``) and for tenants with budgets (``--latency``
   picks), next to the raw transaction on the plain queues, samples interleaved.

3. (part ``cohorts``) the same admissions over 20 tenants, once plain and once in
   4 cohorts of 5 where every admission borrows (each tenant's nominal is 1, one
   lender per cohort holds the room), in the same run: the cost of charging the
   cohort rooms, as a ratio to the plain rate (docs/fair-sharing.md).
4. (part ``budgets``) the same, once plain and once with a roomy GPU budget per
   tenant: the cost of reading and charging budget rows, as a ratio.

Throughput runs for a fixed time; every run starts from the same queue (the
requests are put back to waiting and the usage to zero between runs).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
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

import _pgbench
from _databases import BACKENDS, ServerUnavailable, throwaway_database
from _raw_admission import RawAdmission
from quotagate.cli.common import render_table
from quotagate.domain.budget import BudgetLimit
from quotagate.domain.ordering import DEFAULT_AGING_INTERVAL, queue_key
from quotagate.domain.sharing import TenantSharing
from quotagate.store import admission_stats, schema
from quotagate.store.budgets import BudgetChange
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
COMMIT_EVERY = 100_000


@dataclass(frozen=True)
class Settings:
    seconds: float  # length of one throughput run
    rounds: int  # throughput runs of each kind; the best counts
    queue: int  # waiting requests at the start of each throughput run
    samples: int  # admissions timed per latency scenario
    big_queues: tuple[int, ...]  # the long queues of the latency table
    drain: int  # waiting requests a sustained drain admits to the end
    slices: tuple[int, ...] = (1,)  # capacity slices per pool, one drain each


# FULL's drain is "tens of thousands"; --million adds 1,000,000 to the latency queues.
FULL = Settings(seconds=3.0, rounds=2, queue=30_000, samples=300, big_queues=(100_000,),
                drain=40_000)
QUICK = Settings(seconds=1.0, rounds=1, queue=8_000, samples=60, big_queues=(20_000,),
                 drain=10_000)


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
    reserved_runtime: int | None = None,
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
            "reserved_runtime": reserved_runtime,
        }


def bulk_insert(
    engine: Engine, rows: Iterator[dict[str, Any]], *,
    progress: Callable[[int], None] | None = None,
) -> None:
    """Insert in chunks with executemany, not submit by submit.

    The drivers turn an executemany into few round trips: pymysql rewrites it
    into multi-row ``INSERT … VALUES``, psycopg pipelines it, sqlite3 loops in C
    (50,000 rows in about a second on each). A transaction per
    ``COMMIT_EVERY`` rows keeps a million-row fill from being one huge
    transaction; ``progress`` hears the count after each.
    """
    inserted = 0
    chunk: list[dict[str, Any]] = []
    connection = engine.connect()
    try:
        for row in rows:
            chunk.append(row)
            if len(chunk) == INSERT_CHUNK:
                connection.execute(schema.request.insert(), chunk)
                inserted += len(chunk)
                chunk = []
                if inserted % COMMIT_EVERY == 0:
                    connection.commit()
                    if progress:
                        progress(inserted)
        if chunk:
            connection.execute(schema.request.insert(), chunk)
            inserted += len(chunk)
        connection.commit()
    finally:
        connection.close()
    if progress:
        progress(inserted)
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
            .values(state="waiting", pool=None, pool_slice=None)
        )
        connection.execute(schema.tenant_quota.update().values(used=0))
        connection.execute(schema.pool_capacity.update().values(used=0))
        connection.execute(schema.cohort_usage.update().values(used=0))
        connection.execute(schema.tenant_budget.update().values(reserved=0))
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
    drain: bool = False  # admit until the queue is empty, however long that takes


@dataclass(frozen=True)
class WorkerResult:
    admitted: int
    started: float
    finished: float
    error: str | None = None
    # (monotonic time, admissions so far) after every call that admitted: a drain's course.
    progress: tuple[tuple[float, int], ...] = ()
    # CPU seconds of the admitting process during the run, and its admission reruns by cause.
    cpu: float = 0.0
    reruns: tuple[tuple[str, int], ...] = ()


def _admitter(run: Run) -> tuple[Callable[[], int], Callable[[], None]]:
    """A function admitting once and returning how many, and one closing the connection."""
    if run.raw:
        raw = RawAdmission(run.url, TENANTS)
        return raw.admit_one, raw.close
    ledger = Ledger(create_engine(run.url))
    return (lambda: len(ledger.admit(run.batch))), ledger.engine.dispose


def _admit_until(
    admit: Callable[[], int], start_at: float, seconds: float, *, track: bool = False
) -> WorkerResult:
    while time.monotonic() < start_at:
        time.sleep(0.0005)
    started = finished = time.monotonic()
    deadline = started + seconds
    admitted = idle = 0
    progress: list[tuple[float, int]] = []
    while time.monotonic() < deadline:
        count = admit()
        if count:
            admitted += count
            finished = time.monotonic()
            idle = 0
            if track:
                progress.append((finished, admitted))
        else:
            # Nothing fitted: the queue ran dry (or every candidate was locked by
            # the others for a moment). Give up after a short stretch of nothing.
            idle += 1
            if idle >= 50:
                break
            time.sleep(0.001)
    return WorkerResult(admitted, started, finished, progress=tuple(progress))


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
            cpu_before, reruns_before = time.process_time(), admission_stats.snapshot().reruns
            outcome = _admit_until(admit, start_at, run.seconds, track=run.drain)
            reruns = admission_stats.snapshot().reruns
            replies.put(dataclasses.replace(
                outcome, cpu=time.process_time() - cpu_before,
                reruns=tuple((cause, reruns[cause] - reruns_before.get(cause, 0))
                             for cause in reruns)))
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
        outcomes = self.run(run, processes)
        elapsed = max(o.finished for o in outcomes) - min(o.started for o in outcomes)
        total = sum(o.admitted for o in outcomes)
        return total / elapsed if elapsed > 0 else 0.0

    def run(self, run: Run, processes: int) -> list[WorkerResult]:
        """What each of ``processes`` processes did in ``run``, started at one instant."""
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
        return outcomes


def check_balanced(engine: Engine) -> None:
    """Invariants 1 and 2 (docs/invariants.md) after a run: a fast admission that oversold would not count."""
    violations = LedgerViews(engine).check_invariants()
    if violations:
        raise RuntimeError("the ledger does not balance after a run: " + "; ".join(violations[:5]))


def _pgbench_rate(url: str, processes: int, log: Callable[[str], None], **run: Any) -> float | None:
    """pgbench's transactions per second, or None (logged) where it cannot run."""
    try:
        return _pgbench.run(url, TENANTS, processes, **run)
    except _pgbench.PgbenchUnavailable as error:
        log(f"  pgbench skipped: {error}")
        return None


def _ratio(ours: float, baseline: float | None) -> str:
    return f"{ours / baseline:.2f}x" if baseline else "-"


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
                    if backend == "postgresql":
                        reset(engine)
                        pgbench = _pgbench_rate(url, processes, log, seconds=settings.seconds)
                        check_balanced(engine)
                        if pgbench is not None:
                            log(f"  {backend}: pgbench, {processes} client(s): {pgbench:,.0f}/s")
                            best["pgbench", processes] = max(
                                pgbench, best.get(("pgbench", processes), 0.0))
        finally:
            engine.dispose()
    rows: list[list[str]] = []
    for kind in kinds:
        if kind == "raw":
            continue
        for processes in (1, 4):
            rate, raw_rate = best[kind, processes], best["raw", processes]
            pgbench = best.get(("pgbench", processes))
            rows.append([
                backend, kind, str(processes), f"{rate:,.0f}", f"{raw_rate:,.0f}",
                _ratio(rate, raw_rate), f"{pgbench:,.0f}" if pgbench else "-",
                _ratio(rate, pgbench),
            ])
    return rows


# -- cohorts -----------------------------------------------------------------

COHORT_TENANTS = tuple(f"member-{index:02d}" for index in range(20))
COHORTS = ("cohort-a", "cohort-b", "cohort-c", "cohort-d")


def configure_cohorts(engine: Engine) -> None:
    """20 tenants in 4 cohorts of 5 (two of them under a parent): every admission borrows.

    Each cohort's first tenant lends a roomy nominal; the others have a nominal
    of 1, so almost all they are admitted is borrowed, and every admission
    charges its cohort's room row.
    """
    configuration = Configuration(engine)
    configuration.set_cohort("cohort-a")
    configuration.set_cohort("cohort-b", parent="cohort-a")
    configuration.set_cohort("cohort-c")
    configuration.set_cohort("cohort-d")
    for index, tenant in enumerate(COHORT_TENANTS):
        nominal = ROOMY if index % 5 == 0 else 1
        configuration.set_tenant(tenant, {"gpu": nominal, "cpu": nominal},
                                 sharing=TenantSharing(cohort=COHORTS[index // 5]))
    for pool, capacity in POOLS.items():
        configuration.set_pool(pool, capacity)


def configure_budgets(engine: Engine) -> None:
    """The same 20 tenants, each with a roomy GPU budget: every admission charges a budget
    row (cost x a one-hour max-runtime) after the pools (docs/decisions/710)."""
    configure(engine, {tenant: {"gpu": ROOMY, "cpu": ROOMY} for tenant in COHORT_TENANTS})
    configuration = Configuration(engine)
    for tenant in COHORT_TENANTS:
        configuration.set_tenant(tenant, {}, budget=BudgetChange(
            {"gpu": BudgetLimit(ROOMY * 3600, 30 * 86400)}))


def measure_cohorts(
    backend: str, settings: Settings, pool: WorkerPool, log: Callable[[str], None],
    scenario: str = "cohorts",
) -> list[list[str]]:
    """Plain against cohort (or budget) admissions, same tenants and queue, alternating
    round by round."""
    kinds = {"admit(1)": 1, f"admit({BATCH})": BATCH}
    best: dict[tuple[str, str, int], float] = {}
    # The ratio of each round's pair (plain, then the scenario right after it): on a
    # shared machine the load drifts between rounds, less within one pair.
    paired: dict[tuple[str, int], list[float]] = {}
    with throwaway_database(backend) as plain_url, throwaway_database(backend) as other_url:
        engines = {"plain": create_engine(plain_url), scenario: create_engine(other_url)}
        urls = {"plain": plain_url, scenario: other_url}
        try:
            configure(engines["plain"], {tenant: {"gpu": ROOMY, "cpu": ROOMY}
                                         for tenant in COHORT_TENANTS})
            if scenario == "cohorts":
                configure_cohorts(engines[scenario])
            else:
                configure_budgets(engines[scenario])
            for engine in engines.values():
                bulk_insert(engine, waiting_rows(settings.queue, COHORT_TENANTS, prefix="co",
                                                 start=time.time() - 600, span=300, priority=0))
            if scenario == "budgets":
                with engines[scenario].begin() as connection:
                    connection.execute(schema.request.update().values(reserved_runtime=3600))
            for processes in (1, 4):
                for _round in range(settings.rounds):
                    for kind, batch in kinds.items():
                        rates: dict[str, float] = {}
                        for name, engine in engines.items():
                            reset(engine)
                            rate = pool.throughput(
                                Run(urls[name], False, batch, settings.seconds), processes)
                            check_balanced(engine)
                            log(f"  {backend}: {name} {kind}, {processes} process(es): "
                                f"{rate:,.0f}/s")
                            key = (name, kind, processes)
                            best[key] = max(rate, best.get(key, 0.0))
                            rates[name] = rate
                        if rates["plain"]:
                            paired.setdefault((kind, processes), []).append(
                                rates[scenario] / rates["plain"])
        finally:
            for engine in engines.values():
                engine.dispose()
    return [
        [backend, kind, str(processes), f"{best['plain', kind, processes]:,.0f}",
         f"{best[scenario, kind, processes]:,.0f}",
         _ratio(best[scenario, kind, processes], best["plain", kind, processes]),
         _paired(paired.get((kind, processes), []))]
        for kind in kinds for processes in (1, 4)
    ]


def _paired(ratios: Sequence[float]) -> str:
    """The median of the rounds' ratios, with their range when there are several."""
    if not ratios:
        return "-"
    median = statistics.median(ratios)
    if len(ratios) == 1:
        return f"{median:.2f}x"
    return f"{median:.2f}x ({min(ratios):.2f}-{max(ratios):.2f})"


# -- sustained drain ---------------------------------------------------------


def _drain_course(outcomes: Sequence[WorkerResult]) -> tuple[float, float, float]:
    """Overall admissions/s of a drain, and the rates of its first and last fifth."""
    started = min(o.started for o in outcomes)
    events: list[tuple[float, int]] = []
    for outcome in outcomes:
        before = 0
        for at, so_far in outcome.progress:
            events.append((at, so_far - before))
            before = so_far
    events.sort()
    course: list[tuple[float, int]] = [(started, 0)]
    for at, count in events:
        course.append((at, course[-1][1] + count))
    total = course[-1][1]

    def reached(fraction: float) -> tuple[float, int]:
        """When the drain had first admitted ``fraction`` of everything, and how many."""
        return next(point for point in course if point[1] >= fraction * total)

    def rate(low: float, high: float) -> float:
        (begin, begun), (end, done) = reached(low), reached(high)
        return (done - begun) / (end - begin) if end > begin else 0.0

    return rate(0.0, 1.0), rate(0.0, 0.2), rate(0.8, 1.0)


def measure_drain(
    backend: str, settings: Settings, pool: WorkerPool, log: Callable[[str], None]
) -> list[list[str]]:
    """``admit(16)`` until nothing waits, over ``settings.drain`` requests, 1 and 4 processes.

    Once per capacity slice count of ``settings.slices`` (every pool split into
    that many slices, docs/decisions/029-capacity-slices.md); "4 vs 1" is the
    4-process rate over the 1-process rate of the same slice count, same run.

    Unlike the bursts, nothing is vacuumed during the drain: dead index entries
    behind the head of the queue, and the outbox and audit rows, grow as they
    would for a user running ``quotagate admit --until-idle``. pgbench drains
    the same queue in the same run, a quarter of it (its script cannot stop at
    an empty queue, and one request per transaction takes long on a busy disk).
    """
    rows: list[list[str]] = []
    with throwaway_database(backend) as url:
        engine = create_engine(url)
        try:
            configure(engine, {tenant: {"gpu": ROOMY, "cpu": ROOMY} for tenant in TENANTS})
            bulk_insert(engine, waiting_rows(settings.drain, TENANTS, prefix="dr",
                                             start=time.time() - 600, span=300, priority=0))
            for slices in settings.slices:
                rows += _drain_with_slices(backend, settings, pool, log, engine, url, slices)
        finally:
            engine.dispose()
    return rows


def _drain_with_slices(
    backend: str, settings: Settings, pool: WorkerPool, log: Callable[[str], None],
    engine: Engine, url: str, slices: int,
) -> list[list[str]]:
    rows: list[list[str]] = []
    reset(engine)
    configuration = Configuration(engine)
    for name in POOLS:
        configuration.set_pool(name, {}, slices=slices)
    one_process = 0.0
    for processes in (1, 4):
        reset(engine)
        outcomes = pool.run(Run(url, False, BATCH, 3600.0, drain=True), processes)
        check_balanced(engine)
        overall, first, last = _drain_course(outcomes)
        admitted = sum(o.admitted for o in outcomes)
        with engine.connect() as connection:
            left = connection.execute(
                sa.select(sa.func.count()).where(schema.request.c.state == "waiting")
            ).scalar_one()
        if left:  # the warm-up calls took a few; everything else must be gone
            raise RuntimeError(f"the drain stopped with {left} requests still waiting")
        log(f"  {backend}: drain of {admitted:,}, {slices} slice(s), {processes} "
            f"process(es): {overall:,.0f}/s (first fifth {first:,.0f}/s, "
            f"last fifth {last:,.0f}/s)")
        one_process = one_process or overall
        pgbench = None
        # pgbench's script charges one row per pool and resource: one slice only.
        if backend == "postgresql" and slices == 1:
            reset(engine)
            pgbench = _pgbench_rate(url, processes, log,
                                    transactions=settings.drain // 4 // processes)
            check_balanced(engine)
            if pgbench is not None:
                log(f"  {backend}: pgbench drain, {processes} client(s): {pgbench:,.0f}/s")
        rows.append([
            backend, str(slices), str(processes), f"{admitted:,}", f"{overall:,.0f}",
            f"{first:,.0f}", f"{last:,.0f}", _ratio(overall, one_process),
            f"{pgbench:,.0f}" if pgbench else "-", _ratio(overall, pgbench),
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


# The latency scenarios: plain tenants (TENANTS), cohort members that borrow
# (COHORT_TENANTS in COHORTS, as the cohorts part) and tenants with budgets.
LATENCY_KINDS = ("plain", "cohorts", "budgets")
# What every request of the budgets scenario reserves against its budget (seconds).
RESERVED_RUNTIME = 3600


@dataclass(frozen=True)
class LatencyScenario:
    kind: str  # one of LATENCY_KINDS
    waiting: int
    capped_head: bool  # 99% of the queue, ahead of everyone, on a tenant at its cap

    @property
    def label(self) -> str:
        return f"{self.waiting:,} waiting" + (", head at cap" if self.capped_head else "")


def latency_scenarios(settings: Settings, kinds: Sequence[str]) -> list[LatencyScenario]:
    """Every kind, free and with the head at cap, at 1,000 and at each long queue."""
    return [LatencyScenario(kind, waiting, capped)
            for waiting in (1_000, *settings.big_queues)
            for kind in kinds for capped in (False, True)]


def _configure_latency(engine: Engine, kind: str, *, hog: bool) -> list[str]:
    """Tenants, cohorts, budgets and pools of ``kind``; return the tenants besides the hog.

    The hog, when asked for, can take ``HOG_GPU_CAP`` of its own requests and
    no more: by its gpu quota (plain), by its nominal plus borrowing limit in
    a cohort (cohorts: it borrows 3 of the 4 from its cohort's room), or by its
    gpu budget (budgets: roomy quota, 4 reservations' worth of gpu-hours).
    """
    configuration = Configuration(engine)
    if kind == "plain":
        quotas = {tenant: {"gpu": ROOMY, "cpu": ROOMY} for tenant in TENANTS}
        if hog:
            quotas["hog"] = {"gpu": HOG_GPU_CAP, "cpu": ROOMY}
        configure(engine, quotas)
        return list(TENANTS)
    if kind == "cohorts":
        configure_cohorts(engine)
        if hog:
            configuration.set_tenant("hog", {"gpu": 1, "cpu": 1}, sharing=TenantSharing(
                cohort=COHORTS[0], borrowing_limit={"gpu": HOG_GPU_CAP - 1}))
        return list(COHORT_TENANTS)
    configure_budgets(engine)
    if hog:
        configuration.set_tenant("hog", {"gpu": ROOMY, "cpu": ROOMY}, budget=BudgetChange(
            {"gpu": BudgetLimit(HOG_GPU_CAP * RESERVED_RUNTIME, 30 * 86400)}))
    return list(COHORT_TENANTS)


def fill_queue(
    url: str, settings: Settings, scenario: LatencyScenario, log: Callable[[str], None]
) -> list[str]:
    """Configure a fresh ledger for ``scenario`` and fill its queue; return the tenant names.

    The queue gets as many extra requests as the timed admissions take away
    (ours and, on a plain queue, the raw transaction's), so that
    ``scenario.waiting`` are still there at the last sample.
    """
    extra = 2 * (settings.samples + 5)
    runtime = RESERVED_RUNTIME if scenario.kind == "budgets" else None
    now = time.time()
    began = time.monotonic()
    name = f"{scenario.kind}, {scenario.label}"

    def progress(done: int) -> None:
        log(f"    filling {name}: {done:,} rows ({time.monotonic() - began:.0f} s)")

    engine = create_engine(url)
    try:
        tenants = _configure_latency(engine, scenario.kind, hog=scenario.capped_head)
        if not scenario.capped_head:
            bulk_insert(engine, waiting_rows(scenario.waiting + extra, tenants, prefix="lat",
                                             start=now - 600, span=300, priority=0,
                                             reserved_runtime=runtime), progress=progress)
            return tenants
        # "hog" holds 99% of the queue, all of it ahead of everyone else (older
        # and higher priority), and is at its cap: every admission must look
        # past its head to find the requests of the others.
        hog_waiting = scenario.waiting - scenario.waiting // 100
        bulk_insert(engine, waiting_rows(hog_waiting, ["hog"], prefix="hog", start=now - 900,
                                         span=300, priority=5, costs=(HOG_COST,),
                                         reserved_runtime=runtime), progress=progress)
        # Fill the hog to its cap while only its requests wait: with fair share
        # between tenants, the others (using nothing) would be admitted first.
        filler = Ledger(engine)
        admitted = sum(len(filler.admit(1)) for _ in range(HOG_GPU_CAP))
        if admitted != HOG_GPU_CAP or filler.admit(1):
            raise RuntimeError(f"the hog should take {HOG_GPU_CAP} and no more ({name})")
        bulk_insert(engine, waiting_rows(scenario.waiting // 100 + extra, tenants, prefix="lat",
                                         start=now - 600, span=300, priority=0,
                                         reserved_runtime=runtime))
        return [*tenants, "hog"]
    finally:
        engine.dispose()


def measure_latency(
    backend: str, settings: Settings, log: Callable[[str], None],
    kinds: Sequence[str] = LATENCY_KINDS,
) -> list[list[str]]:
    """Latency of ``admit(1)`` on every scenario's queue at once, and of the raw transaction.

    All the databases exist together and the samples go round all of them, so
    a burst of other load on the machine cannot make one queue size (or kind)
    look slower than another. The raw transaction (``_raw_admission.py``)
    knows no cohorts and no budgets: it runs on the plain queues only, and
    each row shows the one of the plain queue of its size and head. "vs 1,000"
    is a median over the median of the same kind and head with 1,000 waiting,
    same run: flat is 1.0.
    """
    scenarios = latency_scenarios(settings, kinds)
    with contextlib.ExitStack() as stack:
        admitters: list[Callable[[], int]] = []
        # Per scenario, its admitter's index; per plain (waiting, head), the raw one's.
        ours: dict[LatencyScenario, int] = {}
        raws: dict[tuple[int, bool], int] = {}
        engines: list[Engine] = []
        for scenario in scenarios:
            url = stack.enter_context(throwaway_database(backend))
            started = time.monotonic()
            tenants = fill_queue(url, settings, scenario, log)
            log(f"  {backend}: {scenario.kind}, {scenario.label}: filled in "
                f"{time.monotonic() - started:.0f} s")
            engine = create_engine(url)
            stack.callback(engine.dispose)
            engines.append(engine)
            ours[scenario] = len(admitters)
            admitters.append(_admit_one(Ledger(engine)))
            if scenario.kind == "plain":
                raw = RawAdmission(url, tenants)
                stack.callback(raw.close)
                raws[scenario.waiting, scenario.capped_head] = len(admitters)
                admitters.append(raw.admit_one)
        log(f"  {backend}: timing {len(admitters)} admitters, {settings.samples} samples each")
        timings = _timed(admitters, settings.samples)
        for engine in engines:
            check_balanced(engine)
    rows: list[list[str]] = []
    for scenario in scenarios:
        median, p95 = timings[ours[scenario]]
        base = timings[ours[dataclasses.replace(scenario, waiting=1_000)]][0]
        raw_index = raws.get((scenario.waiting, scenario.capped_head))
        log(f"  {backend}: {scenario.kind}, {scenario.label}: median {median:.2f} ms, "
            f"p95 {p95:.2f} ms")
        raw_cells = ["-", "-", "-"]
        if raw_index is not None:
            raw_median, raw_p95 = timings[raw_index]
            raw_base = timings[raws[1_000, scenario.capped_head]][0]
            raw_cells = [f"{raw_median:.2f}", f"{raw_p95:.2f}", _ratio(raw_median, raw_base)]
        rows.append([backend, scenario.kind, scenario.label, f"{median:.2f}", f"{p95:.2f}",
                     _ratio(median, base), *raw_cells])
    return rows


# -- main --------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--backends", default=",".join(BACKENDS),
                        help="comma-separated: sqlite,postgresql,mysql (default: all)")
    parser.add_argument("--quick", action="store_true", help="shorter runs, fewer samples")
    parser.add_argument("--million", action="store_true",
                        help="latency with 1,000,000 waiting too (2 million rows per --latency "
                        "kind; minutes)")
    parser.add_argument("--drain", type=int, default=None,
                        help="waiting requests of the sustained drain (default 40,000; quick 10,000)")
    parser.add_argument("--slices", default="1",
                        help="comma-separated capacity slices per pool, one drain each "
                             "(default 1; e.g. 1,4)")
    parser.add_argument("--rounds", type=int, default=None,
                        help="throughput runs of each kind, alternating scenarios; the best "
                        "counts (default 2; quick 1)")
    parser.add_argument("--seconds", type=float, default=None,
                        help="length of one throughput run (default 3; quick 1)")
    parser.add_argument("--latency", default=",".join(LATENCY_KINDS),
                        help="comma-separated latency scenarios: plain,cohorts,budgets "
                        "(default: all; raw SQL runs on the plain ones)")
    parser.add_argument("--parts", default="throughput,drain,latency,cohorts,budgets",
                        help="comma-separated: throughput,drain,latency,cohorts,budgets "
                        "(default: all)")
    arguments = parser.parse_args(argv)
    backends = [name.strip() for name in arguments.backends.split(",") if name.strip()]
    unknown = sorted(set(backends) - set(BACKENDS))
    if unknown:
        parser.error(f"unknown backend(s) {', '.join(unknown)}; choose from {', '.join(BACKENDS)}")
    settings = QUICK if arguments.quick else FULL
    if arguments.million:
        settings = dataclasses.replace(settings, big_queues=(*settings.big_queues, 1_000_000))
    if arguments.rounds:
        settings = dataclasses.replace(settings, rounds=arguments.rounds)
    if arguments.seconds:
        settings = dataclasses.replace(settings, seconds=arguments.seconds)
    if arguments.drain:
        settings = dataclasses.replace(settings, drain=arguments.drain)
    parts = {name.strip() for name in arguments.parts.split(",") if name.strip()}
    latency_kinds = [name.strip() for name in arguments.latency.split(",") if name.strip()]
    if not latency_kinds or set(latency_kinds) - set(LATENCY_KINDS):
        parser.error(f"--latency takes some of {','.join(LATENCY_KINDS)}")
    try:
        slice_counts = tuple(int(part) for part in arguments.slices.split(",") if part.strip())
    except ValueError:
        parser.error("--slices takes whole numbers, e.g. 1,4")
    settings = dataclasses.replace(settings, slices=slice_counts or (1,))

    began = time.monotonic()

    def log(line: str) -> None:
        print(f"[{time.monotonic() - began:5.0f} s] {line}", file=sys.stderr, flush=True)

    throughput_rows: list[list[str]] = []
    drain_rows: list[list[str]] = []
    latency_rows: list[list[str]] = []
    cohort_rows: list[list[str]] = []
    budget_rows: list[list[str]] = []
    skipped: list[str] = []
    pool = WorkerPool(4)
    try:
        for backend in backends:
            log(f"{backend}:")
            try:
                if "throughput" in parts:
                    throughput_rows += measure_throughput(backend, settings, pool, log)
                if "drain" in parts:
                    drain_rows += measure_drain(backend, settings, pool, log)
                if "latency" in parts:
                    latency_rows += measure_latency(backend, settings, log, latency_kinds)
                if "cohorts" in parts:
                    cohort_rows += measure_cohorts(backend, settings, pool, log)
                if "budgets" in parts:
                    budget_rows += measure_cohorts(backend, settings, pool, log, "budgets")
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
        ["backend", "scenario", "processes", "admissions/s", "raw SQL/s", "ours/raw",
         "pgbench/s", "ours/pgbench"],
        throughput_rows,
    ))
    print()
    print(f"Sustained drain: admit({BATCH}) until nothing waits ({settings.drain:,} waiting at "
          "start, no vacuum during the drain); pgbench drains a quarter of the same queue, "
          "one request per transaction")
    print(render_table(
        ["backend", "slices", "processes", "admitted", "admissions/s", "first fifth/s",
         "last fifth/s", "vs 1 process", "pgbench/s", "ours/pgbench"],
        drain_rows,
    ))
    print()
    print(f"Latency of one admit(1), milliseconds ({settings.samples} samples each, "
          "interleaved; raw: the raw transaction on the plain queue of that size and head; "
          "vs 1,000: over the median of the same scenario with 1,000 waiting)")
    print(render_table(
        ["backend", "scenario", "queue", "median", "p95", "vs 1,000", "raw median", "raw p95",
         "raw vs 1,000"],
        latency_rows,
    ))
    if cohort_rows:
        print()
        print(f"Cohorts: {len(COHORT_TENANTS)} tenants plain, and in {len(COHORTS)} cohorts "
              f"where every admission borrows ({settings.queue:,} waiting at start, same run)")
        print(render_table(
            ["backend", "scenario", "processes", "plain/s", "cohorts/s", "best/best",
             "round ratios, median (range)"],
            cohort_rows,
        ))
    if budget_rows:
        print()
        print(f"Budgets: the same {len(COHORT_TENANTS)} tenants plain, and each with a GPU "
              f"budget every admission charges ({settings.queue:,} waiting at start, same run)")
        print(render_table(
            ["backend", "scenario", "processes", "plain/s", "budgets/s", "best/best",
             "round ratios, median (range)"],
            budget_rows,
        ))
    for line in skipped:
        print(line)
    print(f"\ntotal time {time.monotonic() - began:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
