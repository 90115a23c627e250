"""Named in-process counters, and the port the store and delivery count through.

The app owns one :class:`Counters` for delivery (``Quotagate.delivery_counters``);
the lease store, the outbox and the dispatcher count into it, and the app's
metrics export it (``observability.metrics``). Two apps in one process (tests)
count apart. Plain integers behind a lock: a worker's threads and the HTTP
server's ``/metrics`` handler read them from the same process.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Protocol

__all__ = ["DELIVERY_COUNTERS", "CounterSink", "Counters", "delivery_counters"]

DELIVERY_COUNTERS = (
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
    # Running work whose stop a worker began because its max-runtime passed
    # (tenants with stop_at_max_runtime, docs/decisions/714).
    "overruns",
)


class CounterSink(Protocol):
    """Where a store or a worker counts what it did."""

    def increment(self, name: str, amount: int = 1) -> None: ...


class Counters:
    """A fixed set of named counters, safe to share between threads."""

    def __init__(self, names: Iterable[str]) -> None:
        self._lock = threading.Lock()
        self._values: dict[str, int] = dict.fromkeys(names, 0)

    def increment(self, name: str, amount: int = 1) -> None:
        if name not in self._values:
            raise KeyError(f"unknown counter {name!r}")
        with self._lock:
            self._values[name] += amount

    def snapshot(self) -> dict[str, int]:
        """The counters since they were made (or since ``reset``)."""
        with self._lock:
            return dict(self._values)

    def reset(self) -> None:
        """Start every counter from zero."""
        with self._lock:
            for name in self._values:
                self._values[name] = 0


def delivery_counters() -> Counters:
    """A fresh set of the delivery counters (``DELIVERY_COUNTERS``)."""
    return Counters(DELIVERY_COUNTERS)
