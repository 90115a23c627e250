"""The timing the benchmarks share: the median of repeated calls, after one to warm up; and
processes that start together and report one outcome each."""

from __future__ import annotations

import multiprocessing
import statistics
import time
from collections.abc import Callable
from typing import Any


def median_ms(work: Callable[[], object], repeat: int) -> float:
    """Median wall time of ``repeat`` calls of ``work``, in milliseconds."""
    work()  # warm the pool, the connections and the caches
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        work()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


def outcomes_of_processes(target: Callable[..., None], args: tuple[Any, ...], processes: int,
                          seconds: float) -> list[Any]:
    """Run ``target(*args, start_at, results)`` in ``processes`` spawned processes, which
    wait until ``start_at`` (2 s from now: every one has imported and connected) and put
    one outcome each on ``results``; those outcomes, once every process has ended."""
    context = multiprocessing.get_context("spawn")
    results: Any = context.Queue()
    start_at = time.monotonic() + 2.0
    workers = [context.Process(target=target, args=(*args, start_at, results))
               for _ in range(processes)]
    for worker in workers:
        worker.start()
    outcomes = [results.get(timeout=seconds + 120) for _ in workers]
    for worker in workers:
        worker.join(timeout=60)
    return outcomes
