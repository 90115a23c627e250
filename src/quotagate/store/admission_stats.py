"""Process-wide admission counters: reruns by cause and time spent waiting on locks.

What production must record (docs/dashboard.md): how often an admission
transaction was run again and why, and how long it waited for row locks.
Plain numbers behind a lock, like the delivery counters once were; the metrics
endpoint of the same process exports them, Prometheus sums the processes.
"""

from __future__ import annotations

import threading
import time
from bisect import bisect_left
from dataclasses import dataclass

from sqlalchemy.exc import DBAPIError

from quotagate.store.dialect import retry_cause

# stale_snapshot: a conditional charge missed because another admitter charged first
# (or a sliced pool had the room but no slice did, and it was rebalanced);
# lock_timeout: a lock was not granted in time (or SQLite was busy);
# deadlock: a deadlock or serialization failure rolled the transaction back;
# claims_too_narrow: the tenants this admitter could claim admitted nothing while
# others were held by other admitters, so it ran once more without claims.
RERUN_CAUSES = ("stale_snapshot", "lock_timeout", "deadlock", "claims_too_narrow")
# Seconds, from an uncontended lock (well under a millisecond) to a stuck one.
LOCK_WAIT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


@dataclass(frozen=True)
class AdmissionStats:
    reruns: dict[str, int]
    # Cumulative counts per upper bound of LOCK_WAIT_BUCKETS, then +Inf.
    lock_wait_buckets: list[int]
    lock_wait_sum: float
    lock_wait_count: int


_lock = threading.Lock()
_reruns: dict[str, int] = dict.fromkeys(RERUN_CAUSES, 0)
_bucket_counts: list[int] = [0] * (len(LOCK_WAIT_BUCKETS) + 1)
_wait_sum = 0.0


def count_rerun(cause: str) -> None:
    if cause not in _reruns:
        raise KeyError(f"unknown rerun cause {cause!r}")
    with _lock:
        _reruns[cause] += 1


def count_database_rerun(error: DBAPIError) -> None:
    """``run_transaction``'s retry hook: classify the driver error and count it."""
    count_rerun(retry_cause(error))


def observe_lock_wait(seconds: float) -> None:
    global _wait_sum
    # The first bucket whose bound is >= seconds (the last, +Inf, past them all).
    index = bisect_left(LOCK_WAIT_BUCKETS, seconds)
    with _lock:
        _bucket_counts[index] += 1
        _wait_sum += seconds


class _LockWait:
    """A class, not a ``@contextmanager`` generator: entered twice per admission, and
    the generator's machinery cost more than the timing itself."""

    __slots__ = ("started",)

    def __enter__(self) -> None:
        self.started = time.perf_counter()

    def __exit__(self, *_exc: object) -> None:
        observe_lock_wait(time.perf_counter() - self.started)


def lock_wait() -> _LockWait:
    """Time a statement that takes row locks (it waits while another transaction holds them)."""
    return _LockWait()


class _NoWait:
    """For a transaction whose statements never wait: its one wait was at BEGIN."""

    __slots__ = ()

    def __enter__(self) -> None:
        return None

    def __exit__(self, *_exc: object) -> None:
        return None


_NO_WAIT = _NoWait()


def no_lock_wait() -> _NoWait:
    """:func:`lock_wait`'s stand-in where the statements cannot wait (SQLite: the write
    lock was taken at ``BEGIN IMMEDIATE``, whose wait is observed instead)."""
    return _NO_WAIT


def snapshot() -> AdmissionStats:
    with _lock:
        cumulative, running = [], 0
        for count in _bucket_counts:
            running += count
            cumulative.append(running)
        return AdmissionStats(dict(_reruns), cumulative, _wait_sum, running)


def reset() -> None:
    """For tests: start every counter from zero."""
    global _wait_sum
    with _lock:
        for cause in _reruns:
            _reruns[cause] = 0
        for index in range(len(_bucket_counts)):
            _bucket_counts[index] = 0
        _wait_sum = 0.0
