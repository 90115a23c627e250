"""Process-wide delivery counters, for logs and for the metrics endpoint.

Plain integers behind a lock: a worker's threads and the HTTP server's
``/metrics`` handler read them from the same process.
"""

from __future__ import annotations

import threading

COUNTERS = (
    "claimed",
    "delivered",
    "delivery_errors",
    "retried",
    # Delivery gave up on a request (last attempt, or an error no retry can fix).
    "given_up",
    # What executors reported, read back from the target (not delivery's doing).
    "executor_completed",
    "executor_failed",
    "stale_writes",
    "leases_acquired",
    "leases_lost",
    "stops_claimed",
    "stops_pending",
    "stopped",
)

_lock = threading.Lock()
_values: dict[str, int] = dict.fromkeys(COUNTERS, 0)


def increment(name: str, amount: int = 1) -> None:
    if name not in _values:
        raise KeyError(f"unknown delivery counter {name!r}")
    with _lock:
        _values[name] += amount


def snapshot() -> dict[str, int]:
    """The counters since this process started (or since ``reset``)."""
    with _lock:
        return dict(_values)


def reset() -> None:
    """For tests: start every counter from zero."""
    with _lock:
        for name in _values:
            _values[name] = 0
