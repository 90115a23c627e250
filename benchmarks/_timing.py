"""The timing the read benchmarks share: the median of repeated calls, after one to warm up."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def median_ms(work: Callable[[], object], repeat: int) -> float:
    """Median wall time of ``repeat`` calls of ``work``, in milliseconds."""
    work()  # warm the pool, the connections and the caches
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        work()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000
